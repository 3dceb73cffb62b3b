"""The driver JVM's class archive for real (`orchestrator.services.class_archive`): the first
`tidemark run` that starts Spark has its JVM write the archive at its exit, the next maps it, and
its snapshot is the same. The rest of the suite shares archives in a directory of the session
(tests/conftest.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.services.class_archive import DYNAMIC_MAGIC
from orchestrator.services.spark import CRASH_REPORT_SUFFIX
from tests.conftest import fresh_database, pipeline_config, write_config
from tests.integration.test_cli_run import tidemark

pytestmark = pytest.mark.integration

ROWS = LOCAL_ROWS + 2000  # above the driver's limit: read by Spark


def _complete(cache: Path) -> list[Path]:
    return [p for p in cache.glob("*.jsa") if p.read_bytes()[:4] == DYNAMIC_MAGIC]


def test_the_next_run_maps_the_classes_the_first_jvm_saved(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    fresh_database(
        mariadb,
        "cds_db",
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
        f"INSERT INTO t SELECT seq, CONCAT('v', seq) FROM seq_1_to_{ROWS}",
        "ANALYZE TABLE t",
    )
    path = write_config(
        tmp_path / "p.yaml", pipeline_config(tmp_path, mariadb, [{"name": "cds_db.t"}], name="c")
    )
    cache = tmp_path / "jvm"
    env = {"TIDEMARK_JVM_CACHE": str(cache)}

    first = tidemark("run", "--config", str(path), "--no-progress", env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "saves its classes for the next runs" in first.stdout + first.stderr
    deadline = time.monotonic() + 180  # the JVM writes it after the process ended
    while not _complete(cache) and time.monotonic() < deadline:
        time.sleep(1)
    assert len(_complete(cache)) == 1

    mariadb.execute("INSERT INTO t VALUES (0, 'zero')", database="cds_db")
    second = tidemark("run", "--config", str(path), "--no-progress", "--snapshot", env=env)
    output = second.stdout + second.stderr
    assert second.returncode == 0, second.stderr[-2000:]
    assert "maps its classes from" in output and "spark session started" in output
    lake = Path(load_config(path).output.path)
    manifest = json.loads((lake / "cds_db" / "t" / "_tidemark" / "current.json").read_text())
    assert manifest["rows"] == ROWS + 1

    # A complete archive damaged afterwards (cut short, its header intact) crashes the JVM that
    # maps it: the run removes it, starts the JVM without it, and a later JVM writes a new one.
    # The crash report goes beside the run's log, not into the working directory.
    (archive,) = _complete(cache)
    _wait_unmapped(archive)  # the second run's JVM ends a little after its process
    with archive.open("r+b") as f:
        f.truncate(archive.stat().st_size // 2)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    third = tidemark(
        "run", "--config", str(path), "--no-progress", "--snapshot", env=env, cwd=workdir
    )
    output = third.stdout + third.stderr
    assert third.returncode == 0, third.stderr[-2000:]
    assert "did not start with the class archive" in output
    assert not archive.exists()
    (report,) = tmp_path.rglob(f"c-*{CRASH_REPORT_SUFFIX.replace('%p', '*')}")
    assert f"its crash report: {report}" in output
    assert "SIGBUS" in report.read_text(errors="replace")
    (log,) = report.parent.glob(report.name.partition(".jvm-crash-")[0] + ".log")
    assert "did not start with the class archive" in log.read_text()
    assert not list(workdir.iterdir())  # no hs_err_pid*.log there


def _wait_unmapped(path: Path, seconds: float = 120) -> None:
    """Until no process maps ``path`` (the JVMs that mapped it ended)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_maps(pid, path) for pid in Path("/proc").glob("[0-9]*")):
            return
        time.sleep(0.5)
    raise AssertionError(f"{path} is still mapped after {seconds} s")


def _maps(pid: Path, path: Path) -> bool:
    try:
        return str(path) in (pid / "maps").read_text()
    except OSError:  # ended meanwhile, or not ours to read
        return False
