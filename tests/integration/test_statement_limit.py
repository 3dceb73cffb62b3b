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
from orchestrator.config import load_config
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.jars import MYSQL_CONNECTOR_J, jar_path
from orchestrator.source.connection import Source
from tests.conftest import assert_lake_equals_source, chunked_config, fresh_database
from tests.iceberg_readers import pyiceberg_table
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
    config = chunked_config(
        tmp_path,
        mariadb,
        tables,
        DB,
        source={**mariadb.source_config(), "jdbc_driver_jar": jar_path(MYSQL_CONNECTOR_J)},
        defaults={"chunk_size": 150000, "batch_chunks": 2, "read_margin_seconds": 0.0},
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


def test_a_global_select_limit_or_join_size_does_not_cut_or_refuse_reads(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A global ``sql_select_limit`` (1,000) cut every read short, silently: 2,000 of 400,000
    rows published, exit 0. A low ``max_join_size`` (which turns ``sql_big_selects`` off)
    refused them. Tidemark's sessions lift both (`chunking.mysql.UNBOUNDED_SELECTS`): a table
    read by Spark, one by the driver, one without a key, then changes."""
    db = "tm_select_limit"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.keyed (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.keyed SELECT seq, seq FROM seq_1_to_{LOCAL_ROWS + 5000}",
        f"CREATE TABLE {db}.small (id INT PRIMARY KEY, v INT)",
        f"INSERT INTO {db}.small SELECT seq, seq FROM seq_1_to_3000",
        f"CREATE TABLE {db}.keyless (a INT)",
        f"INSERT INTO {db}.keyless SELECT seq % 10 FROM seq_1_to_3000",
        f"ANALYZE TABLE {db}.keyed",
    )
    tables = [f"{db}.keyed", f"{db}.small", f"{db}.keyless"]
    config = chunked_config(tmp_path, mariadb, tables, name=db)

    def run_limited(variable: str) -> None:
        mariadb.execute(f"SET GLOBAL {variable} = 1000")
        try:
            run = tidemark(config)
        finally:
            mariadb.execute(f"SET GLOBAL {variable} = DEFAULT")
        assert run.returncode == 0, run.stderr[-3000:]

    run_limited("sql_select_limit")  # the snapshot
    assert_lake_equals_source(config, mariadb, tables[:2])
    mariadb.execute(
        f"UPDATE {db}.keyed SET v = -v WHERE id % 100 = 0",
        f"DELETE FROM {db}.small WHERE id > 2500",
        f"INSERT INTO {db}.keyless SELECT seq FROM seq_1_to_50",
        database=db,
    )
    run_limited("max_join_size")  # the changes
    assert_lake_equals_source(config, mariadb, tables[:2])
    with Source.from_pipeline(load_config(config)) as source:
        assert source.query(f"SELECT COUNT(*) FROM {db}.keyless")[0][0] == 3050
    lake = pyiceberg_table(load_config(config), tables[2]).to_pylist()
    assert len(lake) == 3050
