"""A hung source (issue 12, timeouts): a private mariadbd paused with SIGSTOP mid-read and
mid-capture. With ``source.read_timeout: 5`` the run ends with exit 1 and one line naming the
source's host:port and what it was waiting for; after SIGCONT a plain rerun resumes the run and
the lake equals the source. Without the timeouts these runs wait forever (the test's own
timeout fails them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.test_failures import (
    assert_one_clear_line,
    assert_status_shows,
    run,
    start_run,
    wait_until_stopped,
)

pytestmark = pytest.mark.integration

READ_TIMEOUT = 5


@pytest.fixture()
def hung_server(tmp_path: Path) -> Iterator[tuple[LocalMariaDB, Path]]:
    """A private server (the tests pause it) with kill_db.t, and a pipeline with a short
    read_timeout and small capture batches (a checkpoint early in the binlog)."""
    server = LocalMariaDB.create(base_dir=tmp_path)
    server.start()
    server.execute("CREATE DATABASE kill_db")
    server.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))",
        "INSERT INTO t SELECT seq, MD5(seq) FROM seq_1_to_5000",
        database="kill_db",
    )
    source = {**server.source_config(), "read_timeout": READ_TIMEOUT}
    data = pipeline_config(
        tmp_path,
        server,
        [{"name": "kill_db.t"}],
        name="killed",
        source=source,
        defaults={
            "chunk_size": 1000,
            "batch_chunks": 1,
            "read_margin_seconds": 0.0,
            "read_attempts": 2,
            "capture_batch_rows": 10,
        },
    )
    try:
        yield server, write_config(tmp_path / "killed.yaml", data)
    finally:
        resume(server)
        server.destroy()


def pause(server: LocalMariaDB) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def resume(server: LocalMariaDB) -> None:
    if server.process is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.process.pid, signal.SIGCONT)


def finish_hung(
    config: Path, server: LocalMariaDB, proc: subprocess.Popen[str], *waited_for: str
) -> None:
    """The run fails with exit 1 naming the source and what it waited for; after SIGCONT a
    rerun resumes it and the lake equals the source."""
    stdout, stderr = proc.communicate(timeout=600)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    text = assert_one_clear_line(
        result,
        1,
        "no answer from the source",
        f"127.0.0.1:{server.port}",
        f"{READ_TIMEOUT} s",
        "source.read_timeout",
        "resumes",
        *waited_for,
    )
    resume(server)
    assert_status_shows(config, text)
    rerun = run(config)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming unfinished run" in rerun.stdout
    assert_lake_equals_source(config, server, ["kill_db.t"])


def test_source_hung_mid_read(hung_server: tuple[LocalMariaDB, Path]) -> None:
    server, config = hung_server
    proc = start_run(config, failpoint="read.batch_started:1:stop")  # L recorded, the reads next
    wait_until_stopped(proc)
    pause(server)
    os.kill(proc.pid, signal.SIGCONT)
    finish_hung(config, server, proc)


def published_then_changed(config: Path, server: LocalMariaDB, updates: int) -> None:
    """A first run publishes kill_db.t; then ``updates`` updates of every row for the next to
    capture."""
    first = run(config)
    assert first.returncode == 0, first.stderr[-3000:]
    for n in range(updates):
        server.execute(f"UPDATE kill_db.t SET v = MD5(CONCAT(id, '-', {n}))")


def test_source_hung_before_the_binlog_is_opened(hung_server: tuple[LocalMariaDB, Path]) -> None:
    server, config = hung_server
    published_then_changed(config, server, 1)
    proc = start_run(config, failpoint="capture.reading:1:stop")
    wait_until_stopped(proc)
    pause(server)
    os.kill(proc.pid, signal.SIGCONT)
    finish_hung(config, server, proc, "read the binlog from")


def test_source_hung_mid_capture(hung_server: tuple[LocalMariaDB, Path]) -> None:
    """Paused while the dump connection streams an incremental run's binlog: more than the
    sockets buffer (about 45 MB of row images), the run stopped at its first capture
    checkpoint meanwhile."""
    server, config = hung_server
    published_then_changed(config, server, 100)
    proc = start_run(config, failpoint="capture.checkpoint:1:stop")
    wait_until_stopped(proc)
    pause(server)
    os.kill(proc.pid, signal.SIGCONT)
    finish_hung(config, server, proc, "the binlog after")


def test_binlog_connection_dropped_mid_capture_is_retried(
    hung_server: tuple[LocalMariaDB, Path],
) -> None:
    """The dump connection killed on the server while it streams: the capture reconnects from
    its last checkpoint (dropping what it wrote since) and the run succeeds, the lake equal to
    the source: no change lost or applied twice."""
    server, config = hung_server
    published_then_changed(config, server, 100)
    proc = start_run(config, failpoint="capture.checkpoint:1:stop")
    wait_until_stopped(proc)
    dumps = [row[0] for row in server.execute("SHOW PROCESSLIST") if row[4] == "Binlog Dump"]
    assert len(dumps) == 1, server.execute("SHOW PROCESSLIST")
    server.execute(f"KILL {dumps[0]}")
    os.kill(proc.pid, signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert stderr == "", stderr[-3000:]
    assert "lost the binlog connection" in stdout and "reconnecting in" in stdout, stdout[-3000:]
    assert_lake_equals_source(config, server, ["kill_db.t"])
