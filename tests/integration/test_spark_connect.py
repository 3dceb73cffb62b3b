"""`spark.remote`: every step attaches to a Spark Connect server instead of starting a driver JVM.

The server is pyspark's own (`tests/spark_connect.py`). `tidemark run` (its own process)
snapshots a table through it, then applies changes; the lake equals the source both times and
the run's log shows no local session. The run releases its session on the server as it exits
(the server kept it an hour, idle, before).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.spark_connect import connect_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def connect_work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The server's ``sc://`` URL and its log file."""
    work = tmp_path_factory.mktemp("connect")
    with connect_server(work) as url:
        yield url, work / "connect-server.log"


def _run(config: Path) -> str:
    """`tidemark run` in its own process; its log file's text."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = sorted((config.parent / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1].read_text()


def test_a_run_through_spark_connect(
    connect_work: tuple[str, Path], mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    connect_url, server_log = connect_work
    db = "connect_db"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE t (id BIGINT UNSIGNED NOT NULL PRIMARY KEY, v VARCHAR(20) NOT NULL,"
        " at DATETIME(6), ts TIMESTAMP(6) NULL, d DECIMAL(12, 2))",
        "INSERT INTO t SELECT seq * 10, CONCAT('v', seq), '2024-01-01' + INTERVAL seq MINUTE,"
        " '2025-01-01' + INTERVAL seq SECOND, seq / 7 FROM seq_1_to_6000",
        database=db,
    )
    raw = pipeline_config(
        tmp_path,
        mariadb,
        [{"name": f"{db}.t"}],
        name="connect",
        defaults={"chunk_size": 1000, "read_margin_seconds": 0.0},
    )
    raw["spark"] = {"remote": connect_url, "conf": {"spark.sql.shuffle.partitions": "4"}}
    config_path = write_config(tmp_path / "p.yaml", raw)
    first = _run(config_path)
    assert (
        f"spark session attached to {connect_url}" in first and "spark session started" not in first
    )
    assert_lake_equals_source(load_config(config_path), mariadb, [f"{db}.t"])
    (session,) = set(
        re.findall(r"Session with userId: \S* and sessionId: ([-\w]+)", server_log.read_text())
    )
    assert re.search(
        rf"Closing session with userId: \S* and sessionId: {session}", server_log.read_text()
    )
    mariadb.execute(
        "UPDATE t SET v = 'changed' WHERE id % 70 = 0",
        "DELETE FROM t WHERE id BETWEEN 100 AND 300",
        "INSERT INTO t VALUES (99999990, 'new', NULL, NULL, NULL)",
        database=db,
    )
    _run(config_path)
    assert_lake_equals_source(load_config(config_path), mariadb, [f"{db}.t"])
