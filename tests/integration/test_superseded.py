"""A run that a later run superseded cannot go on (found by a review): a cleared Airflow task
of an old DAG run, whose run ``run --snapshot`` had left behind, published that run's older data
over the newer version and moved the table's checkpoint back."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app import steps
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.errors import RunFailed
from orchestrator.lake.manifest import read_published
from orchestrator.pipeline.context import hold_lock, open_store, table_dir
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline

pytestmark = pytest.mark.integration

DB = "superseded"


def test_a_superseded_run_cannot_go_on(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    fresh_database(
        mariadb,
        DB,
        f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, name VARCHAR(10))",
        f"INSERT INTO {DB}.t SELECT seq, 'old' FROM seq_1_to_300",
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{DB}.t"}],
        name=DB,
        defaults={"read_margin_seconds": 0.0},
    )
    holder = "airflow:old-dag-run"
    with hold_lock(config, holder):  # run A, as a DAG run's tasks take it up to publish
        old = steps.plan(config, tables=None, snapshot=False, chunk_size=None, holder=holder)
        for batch in old.batches:
            steps.read_batch(config, old.run_id, batch.batch, holder=holder)
        steps.capture(config, old.run_id)
        steps.reconcile(config, old.run_id)
    steps.fail_run(config, old.run_id, "task publish: disk full", holder=holder)

    mariadb.execute(f"UPDATE {DB}.t SET name = 'new'")
    assert (
        run_command(config, tables=[f"{DB}.t"], snapshot=True, chunk_size=None, progress=False) == 0
    )
    newer = read_published(table_dir(config, f"{DB}.t"))
    assert set(newer.column("name").to_pylist()) == {"new"}

    for step in (
        lambda: steps.read_batch(config, old.run_id, 0, holder=holder),
        lambda: steps.capture(config, old.run_id),
        lambda: steps.reconcile(config, old.run_id),
        lambda: steps.publish(config, old.run_id, holder=holder),
    ):
        with (
            hold_lock(config, holder),
            pytest.raises(RunFailed, match=f"run {old.run_id} .*was superseded by run"),
        ):
            step()
    assert read_published(table_dir(config, f"{DB}.t")).equals(newer)
    store = open_store(config)
    try:
        assert store.get_run(old.run_id).status == "failed"
    finally:
        store.close()
    assert_lake_equals_source(config, mariadb, [f"{DB}.t"])


def test_a_snapshot_request_resumes_its_own_failed_run_and_leaves_anothers(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A cleared DAG run of ``snapshot: true`` (the same lock holder) resumes the run it started,
    its reads kept; another DAG run's snapshot trigger leaves that failed run behind."""
    db = "snapshot_own"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, name VARCHAR(10))",
        f"INSERT INTO {db}.t SELECT seq, 'a' FROM seq_1_to_300",
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [{"name": f"{db}.t"}],
        name=db,
        defaults={"read_margin_seconds": 0.0},
    )
    holder, other = "airflow:tidemark_x/manual__1", "airflow:tidemark_x/manual__2"
    with hold_lock(config, holder):
        first = steps.plan(config, snapshot=True, holder=holder, fresh=True)
    steps.fail_run(config, first.run_id, "task read: the source went away", holder=holder)

    with hold_lock(config, holder):  # the same DAG run, cleared
        again = steps.plan(config, snapshot=True, holder=holder, fresh=True)
    assert again.resumed and again.run_id == first.run_id
    steps.fail_run(config, again.run_id, "task read: the source went away", holder=holder)

    with hold_lock(config, other):  # another DAG run asking the same
        afresh = steps.plan(config, snapshot=True, holder=other, fresh=True)
    assert not afresh.resumed and afresh.run_id != first.run_id
    store = open_store(config)
    try:
        assert store.get_run(first.run_id).status == "failed"
    finally:
        store.close()
