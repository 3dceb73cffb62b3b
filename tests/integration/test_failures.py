"""Failures a user can act on (issue 15), broken on purpose as an operator would: each
`tidemark run` exits with the contract's code, says the cause in one error line without a Java or
Python stack on stderr, records the same text as the run's error in `status`, and a rerun after the
fix makes the lake equal the source."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.errors import resnapshot_hint
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, pipeline_config, start_run, write_config

pytestmark = pytest.mark.integration

#: Runs a command as root without the capability to ignore file modes, so that a directory
#: of mode 555 is not writable even when the tests run as root.
NO_OVERRIDE = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
    "--",
]


def tidemark(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    prefix = NO_OVERRIDE if unprivileged and os.geteuid() == 0 else []
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_FAILPOINT"}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def run(config: Path, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    return tidemark("run", "--config", str(config), "--no-progress", unprivileged=unprivileged)


def assert_one_clear_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The failure is at most 3 lines on stderr, all of them error lines naming the cause (no
    stack trace, no progress or log lines: those go to stdout and the run's log file)."""
    assert result.returncode == code, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("tidemark: error:")]
    assert 1 <= len(lines) <= 3 and errors == lines, result.stderr[-3000:]
    text = "\n".join(errors)
    for word in words:
        assert word in text, text
    return text


def assert_status_shows(config: Path, text: str) -> None:
    """`status` shows the run failed with the same text, and no lock is left behind."""
    status = tidemark("status", "--config", str(config))
    assert status.returncode == 0, status.stderr
    assert "failed" in status.stdout and text.split("tidemark: error: ", 1)[1][:60] in status.stdout
    assert "locked by" not in status.stdout


@pytest.fixture(scope="module")
def source(mariadb: LocalMariaDB) -> LocalMariaDB:
    mariadb.execute("CREATE DATABASE fail_db")
    mariadb.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))",
        "INSERT INTO t SELECT seq, MD5(seq) FROM seq_1_to_3000",
        database="fail_db",
    )
    return mariadb


def assert_rerun_equals_source(
    config: Path, server: LocalMariaDB, table: str = "fail_db.t"
) -> None:
    """After the cause is fixed, a plain rerun succeeds and the lake equals the source."""
    rerun = run(config)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_lake_equals_source(config, server, [table])


def config_for(
    tmp_path: Path, server: LocalMariaDB, name: str, table: str = "fail_db.t", **output: str
) -> Path:
    data = pipeline_config(tmp_path, server, [{"name": table}], name=name)
    data["output"].update(output)
    return write_config(tmp_path / f"{name}.yaml", data)


def test_output_directory_not_writable(source: LocalMariaDB, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir(mode=0o555)
    lake.chmod(0o555)
    config = config_for(tmp_path, source, "ro")
    failed = run(config, unprivileged=True)
    text = assert_one_clear_line(failed, 1, "permission denied", str(lake), "full log: ")
    logfile = text.rsplit("full log: ", 1)[1].rstrip(")")
    assert Path(logfile).is_file()
    assert_status_shows(config, text)
    lake.chmod(0o755)
    assert_rerun_equals_source(config, source)


def test_output_path_under_a_regular_file(source: LocalMariaDB, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory\n")
    config = config_for(tmp_path, source, "nodir", path=str(blocker / "lake"))
    failed = run(config)
    text = assert_one_clear_line(failed, 1, "not a directory", str(blocker))
    assert_status_shows(config, text)
    blocker.unlink()
    assert_rerun_equals_source(config, source)


def test_state_store_not_writable(source: LocalMariaDB, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(0o555)
    data = pipeline_config(tmp_path, source, [{"name": "fail_db.t"}], name="rostate")
    data["state"] = {"url": f"sqlite:///{state_dir / 'state.db'}"}
    config = write_config(tmp_path / "rostate.yaml", data)
    failed = run(config, unprivileged=True)
    assert_one_clear_line(failed, 1, "state store cannot be written", "state.url")
    state_dir.chmod(0o755)
    assert_rerun_equals_source(config, source)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_disk_full(source: LocalMariaDB, tmp_path: Path) -> None:
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    source.execute(
        "CREATE TABLE IF NOT EXISTS fail_db.big (id INT PRIMARY KEY, a CHAR(32), b CHAR(32), "
        "c CHAR(32))",
        "INSERT IGNORE INTO fail_db.big SELECT seq, MD5(seq), MD5(seq + 1e6), MD5(seq + 2e6) "
        "FROM seq_1_to_60000",
        database="fail_db",
    )
    with small_tmpfs(tmp_path / "small", "1m") as small:
        config = config_for(tmp_path, source, "full", table="fail_db.big", path=str(small / "lake"))
        failed = run(config)
        text = assert_one_clear_line(failed, 1, "no space left on device")
        assert_status_shows(config, text)
        subprocess.run(["mount", "-o", "remount,size=256m", str(small)], check=True)
        assert_rerun_equals_source(config, source, "fail_db.big")


def test_run_failure_is_recorded_and_unlocked(source: LocalMariaDB, tmp_path: Path) -> None:
    """A failed run leaves no lock and no `running` run behind (no ghost for the next command)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    config = config_for(tmp_path, source, "ghost", path=str(blocker / "lake"))
    assert run(config).returncode == 1
    store = StateStore(load_config(config).state.url)
    try:
        assert store.lock_info("ghost") is None
        assert [r.status for r in store.runs("ghost")] == ["failed"]
        # the re-snapshot hint works while the failed run exists: it starts afresh, not resumes
        blocker.unlink()
        hint = resnapshot_hint("fail_db.t", config).split(": ", 1)[1].split()
        assert hint[:2] == ["tidemark", "run"]
        fresh = tidemark(*hint[1:], "--no-progress")
        assert fresh.returncode == 0, fresh.stderr[-3000:]
        assert "is not resumed: --snapshot starts a new run" in fresh.stdout
        assert "resuming" not in fresh.stdout
        assert [r.status for r in store.runs("ghost")] == ["succeeded", "failed"]
    finally:
        store.close()
    assert_lake_equals_source(config, source, ["fail_db.t"])


@pytest.fixture()
def own_server(tmp_path: Path) -> Iterator[tuple[LocalMariaDB, Path]]:
    """A private server (the tests kill it) with kill_db.t and a pipeline config for it."""
    server = LocalMariaDB.create(base_dir=tmp_path)
    server.start()
    server.execute("CREATE DATABASE kill_db")
    server.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40))",
        "INSERT INTO t SELECT seq, MD5(seq) FROM seq_1_to_5000",
        database="kill_db",
    )
    data = pipeline_config(
        tmp_path,
        server,
        [{"name": "kill_db.t"}],
        name="killed",
        defaults={
            "chunk_size": 1000,
            "batch_chunks": 1,
            "read_margin_seconds": 0.0,
            "read_attempts": 2,
        },
    )
    yield server, write_config(tmp_path / "killed.yaml", data)
    server.destroy()


def stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"


def wait_until_stopped(proc: subprocess.Popen[str]) -> None:
    """Until the run stopped itself at its failpoint (``name:n:stop``)."""
    deadline = time.monotonic() + 300
    while not stopped(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stderr.read() if proc.stderr else ""
        )
        time.sleep(0.2)


def finish_killed(config: Path, server: LocalMariaDB, proc: subprocess.Popen[str]) -> None:
    """The run fails with exit 1 naming the source; the rerun, the source back, resumes it."""
    stdout, stderr = proc.communicate(timeout=600)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    text = assert_one_clear_line(result, 1, "connection lost", f":{server.port}", "resumes")
    assert_status_shows(config, text)
    server.start()
    rerun = run(config)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "resuming unfinished run" in rerun.stdout
    assert_lake_equals_source(config, server, ["kill_db.t"])


def test_source_killed_mid_read_and_not_back_is_exit_1(
    own_server: tuple[LocalMariaDB, Path],
) -> None:
    """A source that dies after preflight is a failed run (exit 1, state kept), not "source not
    ready" (exit 3, which is preflight's). Killed once the first batch recorded its ``L``."""
    server, config = own_server
    proc = start_run(config, failpoint="read.batch_started:1:stop")
    wait_until_stopped(proc)
    server.kill()
    os.kill(proc.pid, signal.SIGCONT)
    finish_killed(config, server, proc)


def test_source_killed_mid_capture_and_not_back_is_exit_1(
    own_server: tuple[LocalMariaDB, Path],
) -> None:
    """Killed when an incremental run is about to open the binlog it has changes in."""
    server, config = own_server
    first = run(config)
    assert first.returncode == 0, first.stderr[-3000:]
    server.execute("UPDATE kill_db.t SET v = 'changed' WHERE id <= 10")  # something to capture
    proc = start_run(config, failpoint="capture.reading:1:stop")
    wait_until_stopped(proc)
    server.kill()
    os.kill(proc.pid, signal.SIGCONT)
    finish_killed(config, server, proc)


def test_doctor_checks_where_the_run_writes(source: LocalMariaDB, tmp_path: Path) -> None:
    good = config_for(tmp_path, source, "docgood")
    passed = tidemark("doctor", "--config", str(good))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    for name in ("output", "free space output.path", "state store"):
        assert f"PASS  {name}:" in passed.stdout, passed.stdout
    assert not list((tmp_path / "lake").glob(".tidemark-probe-*"))  # the probe is removed again
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    bad = config_for(tmp_path, source, "docbad", path=str(blocker / "lake"))
    failed = tidemark("doctor", "--config", str(bad))
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert f"FAIL  output: {blocker / 'lake'} cannot be written" in failed.stdout, failed.stdout
    assert tidemark("validate", "--config", str(bad)).returncode == 0  # validate stays offline
