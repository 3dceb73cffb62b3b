"""Reconcile in worker processes: a run whose many small tables changed reconciles them on every
core (`orchestrator.pipeline.reconcile.step`, `_in_workers`).

On a private MariaDB, keyed tables and one without a key, each changed after its snapshot
(updates, deletes, inserts, a key changed): the run reconciles them in workers and the lake
equals the source; a crash in a worker kills the run and a rerun resumes; a table failing in a
worker fails alone; a table a worker cannot reconcile without Spark is reconciled by the run.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import load_config
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline import workers
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.reconcile import rewrite, step
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source
from tests.integration.test_consistency import snapshots_per_version
from tests.integration.test_publish_workers import (
    assert_no_process_left,
    pattern_config,
    small_tables,
)
from tests.integration.test_resume import tidemark

pytestmark = pytest.mark.integration

DB = "rw_many"
KEYED = [f"{DB}.t{i:02d}" for i in range(step.WORKERS_FROM)]
KEYLESS = f"{DB}.log"
TABLES = [*KEYED, KEYLESS]

if workers.worker_count(len(TABLES), per_core=1) == 1:
    pytest.skip("one core: the run reconciles its tables itself", allow_module_level=True)


@pytest.fixture()
def source(mariadb: LocalMariaDB) -> LocalMariaDB:
    small_tables(mariadb, DB, KEYED)
    mariadb.execute(
        f"CREATE TABLE {KEYLESS} (a INT, b VARCHAR(20))",
        f"INSERT INTO {KEYLESS} SELECT seq % 50, CONCAT('k', seq % 7) FROM seq_1_to_300",
        database=DB,
    )
    return mariadb


def _config(tmp_path: Path, server: LocalMariaDB) -> Path:
    return pattern_config(tmp_path, server, DB, "rworkers")


def _snapshot(tmp_path: Path, server: LocalMariaDB) -> Path:
    """The pipeline's config, after its first run (a snapshot of every table)."""
    config_path = _config(tmp_path, server)
    assert tidemark(config_path).returncode == 0
    return config_path


def _change(server: LocalMariaDB, salt: int) -> None:
    """A change in every table: updates, deletes, inserts; a key changed in some."""
    for i, table in enumerate(KEYED):
        server.execute(
            f"UPDATE {table} SET v = 'u{salt}', n = n + {salt} WHERE id % 11 = {i % 11}",
            f"DELETE FROM {table} WHERE id = {10 + salt}",
            f"INSERT INTO {table} VALUES ({1000 + salt}, 'new', {salt})",
            *([f"UPDATE {table} SET id = id + 5000 WHERE id = {20 + salt}"] if i % 3 == 0 else []),
        )
    server.execute(
        f"UPDATE {KEYLESS} SET b = 'u{salt}' WHERE a = {salt}",
        f"DELETE FROM {KEYLESS} WHERE a = {salt + 1} LIMIT 2",
        f"INSERT INTO {KEYLESS} VALUES ({salt}, 'again'), ({salt}, 'again')",
    )


def _published(config_path: Path) -> dict[str, int]:
    store = StateStore(load_config(config_path).state.url)
    try:
        return {cp.table: cp.version for cp in store.table_checkpoints("rworkers")}
    finally:
        store.close()


def _reconciled_by_workers(stdout: str, tables: Sequence[str]) -> None:
    assert f"reconciling {len(tables)} tables in " in stdout, stdout[-3000:]
    for table in tables:  # a worker's lines reach the run's log
        assert f"table {table}: changes fall in " in stdout or (
            table == KEYLESS and f"table {table}: " in stdout
        ), stdout[-3000:]


def test_changed_tables_are_reconciled_in_workers(source: LocalMariaDB, tmp_path: Path) -> None:
    config_path = _snapshot(tmp_path, source)
    for salt in (1, 2):
        _change(source, salt)
        run = tidemark(config_path)
        assert run.returncode == 0, run.stderr[-3000:]
        _reconciled_by_workers(run.stdout, TABLES)
        assert_lake_equals_source(config_path, source, TABLES)
    assert set(_published(config_path).values()) == {3}
    snapshots_per_version(config_path, TABLES)


def test_a_crash_in_a_reconcile_worker_kills_the_run_and_the_rerun_resumes(
    source: LocalMariaDB, tmp_path: Path
) -> None:
    config_path = _snapshot(tmp_path, source)
    _change(source, 1)
    killed = tidemark(config_path, failpoint="reconcile.rewritten:2")  # a worker's second table
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    assert f"reconciling {len(TABLES)} tables in " in killed.stdout, killed.stdout[-3000:]
    assert_no_process_left(config_path)
    assert set(_published(config_path).values()) == {1}, "the killed run published nothing"

    _change(source, 2)
    resumed = tidemark(config_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming unfinished run" in resumed.stdout
    assert tidemark(config_path).returncode == 0  # catches up to the second change
    assert_lake_equals_source(config_path, source, TABLES)
    snapshots_per_version(config_path, TABLES)


def test_a_table_failing_in_a_reconcile_worker_fails_alone(
    source: LocalMariaDB, tmp_path: Path
) -> None:
    config_path = _snapshot(tmp_path, source)
    broken_table = KEYED[3]
    tdir = table_dir(load_config(config_path), broken_table)
    data = Path(tdir) / read_manifest(tdir)["files"][0]
    good = data.read_bytes()
    data.write_bytes(b"not parquet" + good[11:])  # its published file damaged
    _change(source, 1)
    run = tidemark(config_path)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("tidemark: error:")]
    assert len(errors) == 1 and f"{broken_table} failed at reconcile: " in errors[0], run.stderr[
        -3000:
    ]
    assert f"reconciling {len(TABLES)} tables in " in run.stdout, run.stdout[-3000:]
    others = [t for t in TABLES if t != broken_table]
    assert_lake_equals_source(config_path, source, others)

    data.write_bytes(good)  # mended: the rerun catches it up, the others go on
    assert tidemark(config_path).returncode == 0
    assert_lake_equals_source(config_path, source, TABLES)


def test_a_table_needing_spark_is_reconciled_by_the_run(
    source: LocalMariaDB,
    tmp_path: Path,
    spark: object,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker starts no Spark session: a table whose changes Spark must merge (more than
    `rewrite.LOCAL_CHANGES_BYTES`; here the choice made for one table) comes back to the run."""
    config = load_config(_config(tmp_path, source))
    assert run_command(config, tables=[], snapshot=True, chunk_size=None, progress=False) == 0
    _change(source, 1)
    choose = rewrite._choose
    big = KEYED[5]
    monkeypatch.setattr(  # the workers are forked with it
        rewrite,
        "_choose",
        lambda target, segments: (
            "spark" if target.table.name == big and segments else choose(target, segments)
        ),
    )
    caplog.set_level(logging.INFO)
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    assert f"reconciling {len(TABLES)} tables in " in caplog.text
    by_spark = [r for r in caplog.records if "; Spark rewrote " in r.getMessage()]
    assert [r.getMessage().split(":")[0] for r in by_spark] == [f"table {big}"]
    assert by_spark[0].process == os.getpid(), "the run reconciled it, not a worker"
    by_driver = [r for r in caplog.records if "; the driver (pyarrow) rewrote " in r.getMessage()]
    assert len(by_driver) == len(KEYED) - 1
    assert all(r.process != os.getpid() for r in by_driver), "the workers reconciled the others"
    assert_lake_equals_source(config, source, TABLES)
