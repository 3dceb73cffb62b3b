"""Runs in which most tables received no change (issue 16): their reconcile plans are written many
to a file, not a directory and a file per table, and a run killed after reconcile recorded them
resumes from that file: the tables keep their version, their checkpoints move on, the lake equals
the source. A real `tidemark run` process, killed with SIGKILL (`orchestrator.services.faults`)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import load_config
from orchestrator.lake import layout, storage
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import reconciled_dir, table_dir
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import StateStore
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.test_resume import tidemark

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUIET = ("q1", "q2", "q3")


def test_a_killed_run_resumes_from_the_shared_plans_of_tables_without_change(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "nochange_kill"
    mariadb.execute(f"CREATE DATABASE {db}")
    for name in (*QUIET, "busy"):
        mariadb.execute(
            f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))",
            f"INSERT INTO {name} SELECT seq, CONCAT('{name}-', seq) FROM seq_1_to_50",
            database=db,
        )
    path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": f"{db}.*"}],
            name="nochange",
            defaults={"read_margin_seconds": 0.0},
        ),
    )
    config = load_config(path)
    first = tidemark(path)
    assert first.returncode == 0, first.stderr[-3000:]
    store = StateStore(config.state.url)
    before = {cp.table: cp for cp in store.table_checkpoints("nochange")}
    mariadb.execute(
        "UPDATE busy SET v = 'changed' WHERE id <= 5", "DELETE FROM busy WHERE id = 50", database=db
    )

    killed = tidemark(path, failpoint="reconcile.table_done:1")
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    run = store.unfinished_run("nochange")
    assert run is not None
    records = {r.table: r for r in store.run_tables(run.run_id)}
    assert {r.status for r in records.values()} == {"reconciled"}
    dirs = {t: reconciled_dir(config, records[t]) for t in (f"{db}.{q}" for q in QUIET)}
    assert len({storage.parent(d) for d in dirs.values()}) == 1, "one plans file for the batch"
    for table, out_dir in dirs.items():
        assert not storage.exists(out_dir), f"{table}: no directory of its own"
        plan = layout.read_plan(out_dir)
        assert plan is not None and plan.base_version == 1 and plan.slots == ()
        assert [f["file"] for f in plan.files] == read_manifest(table_dir(config, table))["files"]
        assert all(f["shared"] for f in plan.files)
    assert storage.exists(
        storage.join(reconciled_dir(config, records[f"{db}.busy"]), layout.PLAN_FILE)
    )

    resumed = tidemark(path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming unfinished run {run.run_id}" in resumed.stdout
    # Tables without a change only move their checkpoints: no worker process is started for them.
    assert "worker processes" not in resumed.stdout, resumed.stdout[-3000:]
    after = {cp.table: cp for cp in store.table_checkpoints("nochange")}
    store.close()
    for q in QUIET:
        table = f"{db}.{q}"
        assert after[table].version == 1 and read_manifest(table_dir(config, table))["version"] == 1
        assert BinlogPosition.from_json(after[table].position) > BinlogPosition.from_json(
            before[table].position
        )
    assert after[f"{db}.busy"].version == 2
    assert_lake_equals_source(path, mariadb, [f"{db}.{t}" for t in (*QUIET, "busy")])


def test_snapshots_without_change_share_a_plans_file_and_a_killed_run_resumes_from_it(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "nochange_first"
    mariadb.execute(f"CREATE DATABASE {db}")
    for name in QUIET:
        mariadb.execute(
            f"CREATE TABLE {name} (id INT PRIMARY KEY, v VARCHAR(20))",
            f"INSERT INTO {name} SELECT seq, CONCAT('{name}-', seq) FROM seq_1_to_40",
            database=db,
        )
    path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": f"{db}.*"}],
            name="first",
            defaults={"read_margin_seconds": 0.0},
        ),
    )
    config = load_config(path)
    killed = tidemark(
        path, failpoint="reconcile.table_done:1"
    )  # the batch recorded, nothing published
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    store = StateStore(config.state.url)
    run = store.unfinished_run("first")
    assert run is not None
    records = {r.table: r for r in store.run_tables(run.run_id)}
    chunks = {c.table: c.path for c in store.chunks(run.run_id)}
    assert {r.status for r in records.values()} == {"reconciled"}
    dirs = {t: reconciled_dir(config, r) for t, r in records.items()}
    assert len({storage.parent(d) for d in dirs.values()}) == 1, "one plans file for the batch"
    for table, out_dir in dirs.items():
        assert not storage.exists(out_dir), f"{table}: no directory of its own"
        plan = layout.read_plan(out_dir)
        assert plan is not None and plan.base_version is None and plan.slots == ()
        assert [f["file"] for f in plan.files] == [chunks[table]], (
            "its chunk's file (read by the driver), moved in"
        )
        assert not any(f["shared"] for f in plan.files) and plan.rows == 40

    mariadb.execute("UPDATE q2 SET v = 'later' WHERE id < 4", database=db)
    resumed = tidemark(path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming unfinished run {run.run_id}" in resumed.stdout
    assert {cp.table: cp.version for cp in store.table_checkpoints("first")} == dict.fromkeys(
        records, 1
    )
    store.close()
    assert tidemark(path).returncode == 0
    assert_lake_equals_source(path, mariadb, list(records))
