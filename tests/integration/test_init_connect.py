"""A server whose ``init_connect`` sets the session's character set (``SET NAMES utf8``, a
classic of my.cnf files): it runs after each driver's handshake asked for utf8mb4, so the Spark
reads got 4-byte characters as ``?``, a wrong table with exit 0. The reads set their character
sets again (`orchestrator.pipeline.read.jdbc.UTF8MB4`). ``init_connect`` runs for a user
without SUPER only, as a pipeline's user is; each driver reads in a `tidemark` process."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import DEFAULT_JDBC_JAR
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.jars import MYSQL_CONNECTOR_J, jar_path
from tests.conftest import assert_lake_equals_source, chunked_config, fresh_database
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize(
    "jar", [DEFAULT_JDBC_JAR, jar_path(MYSQL_CONNECTOR_J)], ids=["mariadb", "mysql"]
)
def test_an_init_connect_setting_names_does_not_change_what_is_read(
    mariadb: LocalMariaDB, tmp_path: Path, jar: str
) -> None:
    db = f"tm_init_connect_{'mysql' if jar != DEFAULT_JDBC_JAR else 'mariadb'}"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.big (id INT PRIMARY KEY, v VARCHAR(20) CHARACTER SET utf8mb4)",
        f"INSERT INTO {db}.big SELECT seq, CONCAT('é😀', seq) FROM seq_1_to_{LOCAL_ROWS + 1000}",
        f"CREATE TABLE {db}.small (id INT PRIMARY KEY, v TEXT CHARACTER SET utf8mb4)",
        f"INSERT INTO {db}.small VALUES (1, 'ü😀')",
        f"ANALYZE TABLE {db}.big",
    )
    mariadb.execute(
        "CREATE USER IF NOT EXISTS tm_plain@'%' IDENTIFIED BY 'pw'",
        "GRANT SELECT, RELOAD, REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO tm_plain@'%'",
    )
    tables = [f"{db}.big", f"{db}.small"]
    source = {**mariadb.source_config(user="tm_plain", password="pw"), "jdbc_driver_jar": jar}
    config = chunked_config(tmp_path, mariadb, tables, name=db, source=source)
    mariadb.execute("SET GLOBAL init_connect = 'SET NAMES utf8'")
    try:
        snapshot = tidemark(config)
        assert snapshot.returncode == 0, snapshot.stderr[-3000:]
        assert f"table {db}.big: snapshot, 3 chunks" in snapshot.stdout + snapshot.stderr
        mariadb.execute(
            f"UPDATE {db}.big SET v = 'ñ🎉' WHERE id % 1000 = 0",
            f"INSERT INTO {db}.small VALUES (2, '🎉')",
        )
        assert tidemark(config).returncode == 0
    finally:
        mariadb.execute("SET GLOBAL init_connect = ''")
    assert_lake_equals_source(config, mariadb, tables)
