"""A run's table set changing under it (found by a review of the Airflow path; the CLI did the
same): a pattern that matches no table yet, and a table removed from the YAML while a run of it
is unfinished. Each stopped the pipeline for good: every later run resumed the failed run and
failed again at plan (exit 2), and `reset --table` of the removed table was refused too."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app import steps
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.app.status import reset_command
from orchestrator.config import PipelineConfig
from orchestrator.pipeline.context import hold_lock, open_store
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline

pytestmark = pytest.mark.integration


def configured(tmp_path: Path, server: LocalMariaDB, db: str, names: list[str]) -> PipelineConfig:
    return load_pipeline(
        tmp_path,
        server,
        [{"name": n} for n in names],
        name=db,
        defaults={"read_margin_seconds": 0.0},
    )


def run(config: PipelineConfig) -> None:
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0


def test_a_pattern_that_matches_nothing_yet_runs_empty(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "rt_empty"
    fresh_database(mariadb, db)
    config = configured(tmp_path, mariadb, db, [f"{db}.*"])
    run(config)
    run(config)  # not a failed run resumed for ever
    mariadb.execute(
        "CREATE TABLE a (id INT PRIMARY KEY, v INT)",
        "INSERT INTO a VALUES (1, 1), (2, 2)",
        database=db,
    )
    run(config)
    assert_lake_equals_source(config, mariadb, [f"{db}.a"])


def test_a_table_removed_from_the_config_leaves_its_unfinished_run(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    db = "rt_removed"
    fresh_database(mariadb, db)
    for name in ("t1", "t2"):
        mariadb.execute(
            f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT)",
            f"INSERT INTO {name} SELECT seq, seq FROM seq_1_to_50",
            database=db,
        )
    both = configured(tmp_path, mariadb, db, [f"{db}.t1", f"{db}.t2"])
    with hold_lock(both, "h"):  # a run planned and read, then failed (as at publish)
        handle = steps.plan(both, tables=None, snapshot=False, chunk_size=None, holder="h")
        for batch in handle.batches:
            steps.read_batch(both, handle.run_id, batch.batch, holder="h")
    steps.fail_run(both, handle.run_id, "task capture: failed", holder="h")

    one = configured(tmp_path, mariadb, db, [f"{db}.t1"])
    # the store still knows t2 (its unfinished run): reset may name it (dry run: nothing changes)
    assert reset_command(one, tables=[f"{db}.t2"], purge_output=False, unlock=False, yes=False) == 0
    mariadb.execute("UPDATE t1 SET v = -v WHERE id <= 10", database=db)
    run(one)  # resumes the failed run without t2
    assert_lake_equals_source(one, mariadb, [f"{db}.t1"])
    store = open_store(one)
    try:
        assert store.get_run(handle.run_id).status == "succeeded"
        assert [r.table for r in store.run_tables(handle.run_id)] == [f"{db}.t1"]
    finally:
        store.close()
