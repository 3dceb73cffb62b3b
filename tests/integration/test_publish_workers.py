"""Publish in worker processes (issue 16): a run of many tables publishes them on every core.

Real `tidemark run` processes on a private MariaDB: a run killed by a crash in one of its
publish workers leaves no process behind (the workers die with the run) and a rerun resumes
it, every table equal to its source with one Iceberg snapshot per version; the workers' log
lines reach the run's log; a table whose publish fails in a worker fails alone.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.pipeline import workers
from orchestrator.pipeline.context import table_dir
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, fresh_database, pipeline_config, write_config
from tests.integration.test_consistency import snapshots_per_version
from tests.integration.test_resume import tidemark

pytestmark = pytest.mark.integration

DB = "pw_many"
TABLES = [f"{DB}.t{i}" for i in range(8)]

if workers.worker_count(len(TABLES)) == 1:
    pytest.skip("one core: the run publishes its tables itself", allow_module_level=True)


def small_tables(server: LocalMariaDB, db: str, tables: list[str]) -> None:
    """Database ``db`` made afresh with ``tables``, 300 keyed rows each."""
    fresh_database(server, db)
    for i, table in enumerate(tables):
        server.execute(
            f"CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(20), n INT)",
            f"INSERT INTO {table} SELECT seq, CONCAT('v', seq), seq * {i} FROM seq_1_to_300",
            database=db,
        )


def pattern_config(tmp_path: Path, server: LocalMariaDB, db: str, name: str) -> Path:
    """A pipeline ``name`` of every table of ``db`` (one pattern entry)."""
    return write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            server,
            [{"name": f"{db}.*"}],
            name=name,
            defaults={"read_margin_seconds": 0.0},
        ),
    )


def assert_no_process_left(config_path: Path) -> None:
    """Within 10 s, no process of a killed run of ``config_path`` (the run, its workers) is left."""
    deadline = time.monotonic() + 10
    while (left := _processes_of(config_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of the killed run are still alive: {left}"


@pytest.fixture()
def source(mariadb: LocalMariaDB) -> LocalMariaDB:
    small_tables(mariadb, DB, TABLES)
    return mariadb


def _config(tmp_path: Path, server: LocalMariaDB) -> Path:
    return pattern_config(tmp_path, server, DB, "workers")


def _processes_of(config_path: Path) -> list[int]:
    """The pids of processes whose command line names ``config_path`` (a run and its workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(config_path).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return found


def test_a_crash_in_a_worker_kills_the_run_and_the_rerun_resumes(
    source: LocalMariaDB, tmp_path: Path
) -> None:
    config_path = _config(tmp_path, source)
    killed = tidemark(
        config_path, failpoint="publish.iceberg_committed:2"
    )  # a worker's second commit
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    assert f"publishing {len(TABLES)} tables in " in killed.stdout, killed.stdout[-3000:]
    assert_no_process_left(config_path)

    source.execute(
        f"UPDATE {TABLES[0]} SET v = 'changed' WHERE id % 7 = 0",
        f"DELETE FROM {TABLES[5]} WHERE id < 20",
    )
    resumed = tidemark(config_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming unfinished run" in resumed.stdout
    store = StateStore(load_config(config_path).state.url)
    try:
        published = {cp.table for cp in store.table_checkpoints("workers")}
    finally:
        store.close()
    assert published == set(TABLES)
    # Every table went through the rerun's workers (published, or found committed or published by
    # the killed run), and what they logged is in the run's log.
    logged = {
        t for t in TABLES if f"orchestrator.pipeline.publish.step: table {t}: " in resumed.stdout
    }
    assert logged == set(TABLES), resumed.stdout[-3000:]
    assert tidemark(config_path).returncode == 0  # catches up to the changes
    assert_lake_equals_source(config_path, source, TABLES)
    snapshots_per_version(config_path, TABLES)


def test_a_table_failing_in_a_worker_fails_alone(source: LocalMariaDB, tmp_path: Path) -> None:
    config_path = _config(tmp_path, source)
    broken = Path(table_dir(load_config(config_path), TABLES[3])) / "_tidemark" / "current.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{ not a manifest")
    run = tidemark(config_path)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("tidemark: error:")]
    assert len(errors) == 1 and f"{TABLES[3]} failed at publish: " in errors[0], run.stderr[-3000:]
    assert_lake_equals_source(config_path, source, [t for t in TABLES if t != TABLES[3]])

    broken.unlink()  # fixed: the rerun publishes it, the others go on
    assert tidemark(config_path).returncode == 0
    assert_lake_equals_source(config_path, source, TABLES)
