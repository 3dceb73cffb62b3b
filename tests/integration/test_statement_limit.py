"""A source whose DBA bounds every statement's time (MariaDB's global ``max_statement_time``,
MySQL's ``max_execution_time``) below what a read takes: Tidemark's sessions lift the limit for
themselves, as ``mariadb-dump`` does (`Dialect.statement_limit`), and ``source.read_timeout``
bounds them instead. Before, the server cut the reads short (a table without a key read whole
by the driver; a chunk read through MySQL's Connector/J, whose ``queryTimeout`` is a timer of
its own) and the run failed as if the source were hung ("no answer ... within
source.read_timeout"), at every rerun."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.services.jars import MYSQL_CONNECTOR_J, jar_path
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DB = "tm_statement_limit"


def test_reads_longer_than_the_servers_statement_limit_complete(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    fresh_database(
        mariadb,
        DB,
        f"CREATE TABLE {DB}.keyed (id INT PRIMARY KEY, t VARCHAR(300))",
        f"INSERT INTO {DB}.keyed SELECT seq, REPEAT('k', 300) FROM seq_1_to_300000",
        f"CREATE TABLE {DB}.keyless (a INT, t VARCHAR(300))",
        f"INSERT INTO {DB}.keyless SELECT seq, REPEAT('n', 300) FROM seq_1_to_300000",
        f"ANALYZE TABLE {DB}.keyed",
    )
    timed = mariadb.connect()
    try:
        with timed.cursor() as cur:
            cur.execute("SET SESSION max_statement_time = 0.2")
            with pytest.raises(pymysql.err.MySQLError, match="max_statement_time"):
                cur.execute(f"SELECT * FROM {DB}.keyless ORDER BY t, a")  # the limit bites
    finally:
        timed.close()
    tables = [f"{DB}.keyed", f"{DB}.keyless"]
    config = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name=DB,
            source={**mariadb.source_config(), "jdbc_driver_jar": jar_path(MYSQL_CONNECTOR_J)},
            defaults={"chunk_size": 150000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )

    def run_limited() -> None:
        mariadb.execute("SET GLOBAL max_statement_time = 0.2")
        try:
            run = tidemark(config)
        finally:
            mariadb.execute("SET GLOBAL max_statement_time = 0")
        assert run.returncode == 0, run.stderr[-3000:]

    run_limited()
    assert_lake_equals_source(config, mariadb, tables)
    mariadb.execute(f"UPDATE {DB}.keyed SET t = 'changed' WHERE id % 1000 = 0")
    mariadb.execute(f"DELETE FROM {DB}.keyless WHERE a % 7 = 0")
    run_limited()
    assert_lake_equals_source(config, mariadb, tables)
