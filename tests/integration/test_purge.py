"""Binlog purged under a pipeline: a clear error naming the file and what must be read again, and
a rerun that recovers. Runs on its own MariaDB: purging binlogs would disturb other tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def tidemark(config: Path, failpoint: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_FAILPOINT"}
    if failpoint:
        env["TIDEMARK_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def verb(name: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", name, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def purge_all_but_current(server: LocalMariaDB) -> str:
    """Rotate and purge every older binlog. MariaDB keeps a file until its transactions are
    checkpointed in InnoDB (a moment after commit), so PURGE is repeated until it took."""
    server.execute("FLUSH BINARY LOGS")
    current = str(server.execute("SHOW MASTER STATUS")[0][0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        server.execute(f"PURGE BINARY LOGS TO '{current}'")
        if server.execute("SHOW BINARY LOGS")[0][0] == current:
            return current
        time.sleep(0.2)
    raise AssertionError(f"could not purge the binlogs before {current}")


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[LocalMariaDB, Path]:
    server = LocalMariaDB.create(base_dir=tmp_path)
    server.start()
    server.execute("CREATE DATABASE purge_db")
    server.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20))",
        "INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_4000",
        database="purge_db",
    )
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            server,
            [{"name": "purge_db.t"}],
            name="purge",
            defaults={"chunk_size": 500, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )
    yield server, config_path
    server.destroy()


def test_published_table_whose_binlog_was_purged_is_snapshotted_again(
    setup: tuple[LocalMariaDB, Path],
) -> None:
    server, config_path = setup
    assert tidemark(config_path).returncode == 0
    server.execute(
        "UPDATE purge_db.t SET v = 'lost?' WHERE id <= 100",
        "DELETE FROM purge_db.t WHERE id > 3900",
    )
    purge_all_but_current(server)
    # doctor and status say so before a run: the table needs a re-read, and how to get it
    doctor = verb("doctor", config_path)
    assert doctor.returncode == 3, doctor.stdout + doctor.stderr
    failed = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "binlog kept purge_db.t" in failed[0], doctor.stdout
    assert "was purged" in failed[0] and f"tidemark run --config {config_path}" in failed[0]
    status = verb("status", config_path)
    assert status.returncode == 0 and "needs a re-read" in status.stdout, (
        status.stdout + status.stderr
    )
    result = tidemark(config_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "was purged" in result.stdout and "snapshotted again" in result.stdout
    assert_lake_equals_source(config_path, server, ["purge_db.t"])
    assert verb("doctor", config_path).returncode == 0


def test_binlog_purged_during_a_run_names_file_and_chunks_and_rerun_recovers(
    setup: tuple[LocalMariaDB, Path],
) -> None:
    server, config_path = setup
    killed = tidemark(config_path, failpoint="read.batch_done:1")
    assert killed.returncode != 0
    server.execute(
        "UPDATE purge_db.t SET v = 'during' WHERE id % 7 = 0",
        "INSERT INTO purge_db.t VALUES (9999, 'new')",
    )
    first_kept = purge_all_but_current(server)
    doctor = verb("doctor", config_path)
    assert doctor.returncode == 3 and "FAIL  binlog kept purge_db.t: run " in doctor.stdout, (
        doctor.stdout
    )
    assert "needs a re-read" in verb("status", config_path).stdout
    failed = tidemark(config_path)
    assert failed.returncode == 1, failed.stderr[-3000:]
    message = failed.stderr
    assert "binlog.000001" in message and "was purged" in message and first_kept in message
    assert "purge_db.t (8 chunks)" in message and "rerun" in message
    assert "Traceback" not in message
    recovered = tidemark(config_path)
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert_lake_equals_source(config_path, server, ["purge_db.t"])
