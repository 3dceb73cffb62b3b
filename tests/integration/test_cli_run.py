"""`tidemark run`, `status` and `reset` as a user runs them: real processes, real exit codes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.errors import RunLocked
from orchestrator.lake.iceberg import open_catalog
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.conftest import fresh_database

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-Pa55-word"


def tidemark(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def config_path(mariadb: LocalMariaDB, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli")
    mariadb.execute("CREATE DATABASE cli_db")
    mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(8,2))",
        "INSERT INTO items SELECT seq, CONCAT('item', seq), seq / 4 FROM seq_1_to_3000",
        database="cli_db",
    )
    mariadb.create_user("cli_user", PASSWORD)
    config = pipeline_config(tmp, mariadb, [{"name": "cli_db.items"}], name="cli")
    config["source"] = {
        **mariadb.source_config(user="cli_user"),
        "password_env": "CLI_TEST_PASSWORD",
    }
    return write_config(tmp / "cli.yaml", config)


def one_table(mariadb: LocalMariaDB, tmp_path: Path, name: str, create: str, fill: str) -> Path:
    """Pipeline ``name`` of table ``<name>_db.t`` (made anew by ``create`` and ``fill``): its
    config file."""
    fresh_database(mariadb, f"{name}_db")
    mariadb.execute(create, fill, database=f"{name}_db")
    return write_config(
        tmp_path / f"{name}.yaml",
        pipeline_config(tmp_path, mariadb, [{"name": f"{name}_db.t"}], name=name),
    )


def test_run_status_reset(config_path: Path, mariadb: LocalMariaDB) -> None:
    env = {"CLI_TEST_PASSWORD": PASSWORD}
    first = tidemark("run", "--config", str(config_path), "--no-progress", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "cli_db.items" in first.stdout and "3,000" in first.stdout
    mariadb.execute(
        "UPDATE cli_db.items SET price = 0 WHERE id <= 10",
        "DELETE FROM cli_db.items WHERE id = 3000",
    )
    second = tidemark("run", "--config", str(config_path), "--no-progress", env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "2,999" in second.stdout
    table_dir = Path(load_config(config_path, check_env=False).output.path) / "cli_db" / "items"
    manifest = json.loads((table_dir / "_tidemark" / "current.json").read_text())
    assert manifest["version"] == 2 and manifest["rows"] == 2999

    status = tidemark("status", "--config", str(config_path), env=env)
    assert status.returncode == 0, status.stderr
    assert (
        "succeeded" in status.stdout
        and "v2" in status.stdout
        and "binlog bytes behind" in status.stdout
    )
    assert f"iceberg snapshot {manifest['iceberg']['snapshot_id']}" in status.stdout
    report = json.loads(tidemark("status", "--config", str(config_path), "--json", env=env).stdout)
    assert [r["status"] for r in report["runs"]] == ["succeeded", "succeeded"]
    (items,) = report["published"]
    assert (items["table"], items["version"], items["rows"]) == ("cli_db.items", 2, 2999)
    assert items["iceberg_snapshot_id"] == manifest["iceberg"]["snapshot_id"]
    assert report["source_reachable"] and isinstance(items["binlog_bytes_behind"], int)
    assert f"{items['binlog_bytes_behind']:,} binlog bytes behind" in status.stdout
    assert items["position"]["file"] == manifest["position"]["file"]
    (latest,) = report["latest_run_tables"]
    assert latest["table"] == "cli_db.items" and latest["failure"] is None

    dry = tidemark("reset", "--config", str(config_path), "--purge-output", env=env)
    assert dry.returncode == 0 and "add --yes" in dry.stdout
    assert (table_dir / "_tidemark" / "current.json").exists(), (
        "reset without --yes must change nothing"
    )
    done = tidemark("reset", "--config", str(config_path), "--purge-output", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert not table_dir.exists()
    assert not open_catalog(load_config(config_path, check_env=False)).table_exists("cli_db.items")
    status = tidemark("status", "--config", str(config_path), env=env)
    assert "nothing published yet" in status.stdout
    for result in (first, second, status, dry, done):
        assert PASSWORD not in result.stdout + result.stderr


def test_second_run_is_refused_while_one_is_active(config_path: Path) -> None:
    config = load_config(config_path, check_env=False)
    store = StateStore(config.state.url)
    holder = f"cli:{socket.gethostname()}:{os.getpid()}"  # this live process holds the lock
    store.acquire_lock(config.pipeline, holder)
    try:
        refused = tidemark(
            "run",
            "--config",
            str(config_path),
            "--no-progress",
            env={"CLI_TEST_PASSWORD": PASSWORD},
        )
        assert refused.returncode == 1
        assert holder in refused.stderr and "Traceback" not in refused.stderr
    finally:
        store.release_lock(config.pipeline, holder)
        store.close()


def test_unset_password_env_is_a_config_error(config_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLI_TEST_PASSWORD"}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "--config", str(config_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "CLI_TEST_PASSWORD" in result.stderr and "source.password_env" in result.stderr


def _version(current: Path) -> int:
    try:
        return int(json.loads(current.read_text())["version"])
    except (OSError, ValueError):
        return 0


def _until(
    what: str, done: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 300
) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert proc.poll() is None, (
            f"the loop ended early (exit {proc.returncode}) waiting for {what}"
        )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_every_keeps_the_lake_current_through_failed_runs_until_sigterm(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    config_path = one_table(
        mariadb,
        tmp_path,
        "every",
        "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
        "INSERT INTO t SELECT seq, seq FROM seq_1_to_500",
    )
    current = tmp_path / "lake" / "every_db" / "t" / "_tidemark" / "current.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--config",
            str(config_path),
            "--every",
            "0.3s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = StateStore(load_config(config_path).state.url)
    holder = f"test:{socket.gethostname()}:{os.getpid()}"  # alive: never taken over as stale
    try:
        _until("the first snapshot", lambda: _version(current) == 1, proc)
        mariadb.execute(
            "UPDATE t SET v = -v WHERE id <= 50",
            "DELETE FROM t WHERE id > 490",
            "INSERT INTO t VALUES (1000, 1)",
            database="every_db",
        )
        _until(
            "the change applied by a later run of the same process",
            lambda: _version(current) == 2,
            proc,
        )
        # runs that fail (another holder has the lock) do not end the loop; the next one catches up
        while True:
            try:
                store.acquire_lock("every", holder)
                break
            except RunLocked:
                time.sleep(0.05)
        mariadb.execute("DELETE FROM t WHERE id <= 10", database="every_db")
        time.sleep(1.5)  # a few runs refused
        store.release_lock("every", holder)
        _until("the change after the refused runs", lambda: _version(current) == 3, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
        store.close()
    assert proc.returncode == 0, err[-3000:]
    assert "stopping after the run in progress" in err
    assert holder in err and "Traceback" not in err  # the refused runs, one line each
    assert "stopped after" in out
    assert re.search(r"failed \(exit 1: .*test:.*\); the next one starts in", out), out[
        -3000:
    ]  # names the holder
    assert_lake_equals_source(config_path, mariadb, ["every_db.t"])
    logs = list((tmp_path / "logs").glob("every-*.log"))  # the process's, every run of it
    assert len(logs) == 1 and logs[0].read_text().count("every_db.t: published version") == 3
    assert "stopped after" in logs[0].read_text()


def test_an_incremental_run_reads_the_files_it_rewrites_ahead(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """`tidemark run` reads a table's published files while it starts
    (`orchestrator.lake.readahead`); the rewrite takes each file it rewrites from there, and the
    table is published equal to the source."""
    config = one_table(
        mariadb,
        tmp_path,
        "ahead",
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(30), n INT)",
        "INSERT INTO t SELECT seq, CONCAT('row ', seq), seq FROM seq_1_to_6000",
    )
    first = tidemark("run", "--config", str(config), "--no-progress", "--snapshot")
    assert first.returncode == 0, first.stderr[-2000:]
    mariadb.execute(
        "UPDATE t SET n = -n WHERE id % 700 = 3",  # in every file
        "DELETE FROM t WHERE id % 1100 = 5",
        "INSERT INTO t VALUES (6001, 'new', 1), (2500000, 'far', 2)",
        database="ahead_db",
    )
    second = tidemark("run", "--config", str(config), "--no-progress", "--debug")
    assert second.returncode == 0, second.stderr[-2000:]
    assert_lake_equals_source(config, mariadb, ["ahead_db.t"])
    out = second.stdout + second.stderr
    rewrote = re.search(r"the driver \(pyarrow\) rewrote (\d+) of (\d+) file", out)
    ahead = re.search(r"read ahead (\d+) file\(s\), (\d+) taken by the rewrite", out)
    assert rewrote and ahead, out[-3000:]
    assert int(rewrote[1]) == int(rewrote[2]) == 6  # 6,000 rows in files of 1,000
    assert int(ahead[2]) == 6, ahead[0]

    # nothing written since: the binlog ends where the version was taken, nothing is read
    quiet = tidemark("run", "--config", str(config), "--no-progress", "--debug")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "read ahead" not in quiet.stdout + quiet.stderr
    mariadb.execute("UPDATE t SET n = 0 WHERE id = 6001", database="ahead_db")
    moved = tidemark("run", "--config", str(config), "--no-progress", "--debug")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert re.search(r"read ahead \d+ file\(s\), 1 taken by the rewrite", moved.stderr)
    assert_lake_equals_source(config, mariadb, ["ahead_db.t"])
