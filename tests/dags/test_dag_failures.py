"""``dag.test()`` of runs where something fails, against a private MariaDB and local Spark.

- A table failing preflight's checks of its own (a column named like Tidemark's own, a
  missing table) is left out of the run, as ``tidemark run`` leaves it out: the others are
  published and the run ends ``partial``; ``publish`` records the published tables' asset
  events and ``outcome`` fails the DAG run.
- A failed DAG run leaves the pipeline lock free, so the next trigger is not refused for a
  whole lease: a mapped ``read`` that starts after a sibling failed for good, and a ``plan``
  that failed after taking the lock, both release it; another run's live lock is kept.
- A run of more batches than Airflow maps from one task (``[core] max_map_length``) fails
  ``plan`` saying so; the run stays planned, and once the limit is raised the next DAG run
  resumes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.errors import RunLocked
from orchestrator.state.store import StateStore
from tests.dags.sources import (
    connection_json,
    create_tables,
    engine_missing,
    manifest,
    published_rows,
    source_rows,
    write_pipeline,
)
from tests.dags.test_dag_run import load_dag_of, task_states

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]

PARTIAL, LOCKED, MAPPED = "tm_dagpartial", "tm_daglock", "tm_dagmapped"
CONN_ID = "tidemark_dagfail_source"


def pipeline(
    monkeypatch: pytest.MonkeyPatch,
    work: Path,
    server: LocalMariaDB,
    db: str,
    tables: list[str] | None = None,
) -> Path:
    """The configs folder of pipeline ``db`` (default tables ``<db>.t1`` and ``<db>.t2``)."""
    configs = work / "configs"
    path = write_pipeline(configs, work, server, db, CONN_ID)
    if tables is not None:
        data = yaml.safe_load(path.read_text())
        data["tables"] = [{"name": name} for name in tables]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(server))
    return configs


def events(dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    """The asset events the DAG run recorded: ``{uri: extra}``."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
    return {uri: extra for uri, extra in rows}


def state(work: Path) -> StateStore:
    return StateStore(f"sqlite:///{work / 'state.db'}")


# ------------------------------------------------------------------ tables failing their own checks


@pytest.fixture(scope="module")
def partial_run(
    mariadb: LocalMariaDB, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One DAG run of ``t1`` (good), ``geo`` (a column named like Tidemark's change columns) and
    ``missing`` (no such table)."""
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("partial")
    create_tables(mariadb, PARTIAL)
    mariadb.execute(
        f"CREATE TABLE {PARTIAL}.geo (id INT PRIMARY KEY, _tm_g INT NOT NULL)",
        f"INSERT INTO {PARTIAL}.geo VALUES (1, 1)",
    )
    tables = [f"{PARTIAL}.t1", f"{PARTIAL}.geo", f"{PARTIAL}.missing"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        configs = pipeline(monkeypatch, work, mariadb, PARTIAL, tables)
        run = load_dag_of(monkeypatch, configs, f"tidemark_{PARTIAL}").test()
    store = state(work)
    try:
        (record,) = store.runs(PARTIAL)
        failed = {
            r.table: r.info.get("failure", {})
            for r in store.run_tables_where(record.run_id, status="failed")
        }
        lock = store.lock_info(PARTIAL)
    finally:
        store.close()
    yield {
        "run": run,
        "states": task_states(run),
        "lake": work / "lake",
        "record": record,
        "failed": failed,
        "lock": lock,
        "events": events(f"tidemark_{PARTIAL}", run.run_id),
    }


def test_a_table_failing_preflight_is_left_out_and_the_others_published(
    partial_run: dict[str, Any], mariadb: LocalMariaDB
) -> None:
    states, failed = partial_run["states"], partial_run["failed"]
    assert partial_run["run"].state == "failed", states  # as `tidemark run` exits 1
    ran = {t: s for t, s in states.items() if t != "outcome[-1]"}
    assert set(ran.values()) == {"success"} and states["outcome[-1]"] == "failed", states
    t1 = f"{PARTIAL}.t1"
    assert published_rows(partial_run["lake"], t1) == source_rows(mariadb, t1)
    assert partial_run["record"].status == "partial"
    # the checks' per-table failures: recorded failed by plan, never planned or read
    assert set(failed) == {f"{PARTIAL}.geo", f"{PARTIAL}.missing"}
    assert {f["step"] for f in failed.values()} == {"plan"}
    assert "_tm_g" in failed[f"{PARTIAL}.geo"]["reason"]
    assert manifest(partial_run["lake"], f"{PARTIAL}.geo") is None
    assert partial_run["lock"] is None, "the partial run left the pipeline lock held"


def test_a_partial_run_records_the_published_tables_asset_events(
    partial_run: dict[str, Any],
) -> None:
    lake, found = partial_run["lake"], partial_run["events"]
    t1, geo = (f"file://{lake}/{PARTIAL}/{t}" for t in ("t1", "geo"))
    assert found[t1]["published"] is True and found[t1]["rows"] == 300
    assert found[t1]["version"] == manifest(lake, f"{PARTIAL}.t1")["version"]  # type: ignore[index]
    assert found[geo]["published"] is False
    assert found[geo]["failed"]["step"] == "plan" and "_tm_g" in found[geo]["failed"]["reason"]
    assert "failed" not in found[t1]


# ------------------------------------------------------------------ the lock after a failed DAG run


def test_a_read_starting_after_a_sibling_failed_leaves_the_lock_free(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    create_tables(mariadb, LOCKED, rows=400)  # 4 chunks of 100: two read batches of 2
    configs = pipeline(monkeypatch, tmp_path, mariadb, LOCKED, [f"{LOCKED}.t1"])
    from orchestrator.app import steps

    real, calls = steps.read_batch, []

    def first_batch_lost(config: Any, run: str, batch: int, **kwargs: Any) -> Any:
        calls.append(batch)
        if len(calls) == 1:  # the worker of the first read task dies (OOM, a lost node): not here
            raise RuntimeError("simulated: the worker of this read task was lost")
        return real(config, run, batch, **kwargs)

    monkeypatch.setattr(steps, "read_batch", first_batch_lost)
    failed = load_dag_of(monkeypatch, configs, f"tidemark_{LOCKED}").test()
    monkeypatch.setattr(steps, "read_batch", real)

    states = task_states(failed)
    assert failed.state == "failed", states
    assert sorted(s for t, s in states.items() if t.startswith("read[")) == ["failed", "success"], (
        states
    )
    assert len(calls) == 2, "the sibling read task ran after the first one failed for good"
    store = state(tmp_path)
    try:
        assert store.lock_info(LOCKED) is None, "the failed DAG run kept the pipeline lock"
        assert store.runs(LOCKED)[0].status == "failed"
    finally:
        store.close()

    again = load_dag_of(monkeypatch, configs, f"tidemark_{LOCKED}").test()  # not refused: RunLocked

    assert again.state == "success", task_states(again)
    t1 = f"{LOCKED}.t1"
    assert published_rows(tmp_path / "lake", t1) == source_rows(mariadb, t1)


def test_a_plan_failing_after_it_took_the_lock_releases_it(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_tables(mariadb, LOCKED)
    configs = pipeline(monkeypatch, tmp_path, mariadb, LOCKED, [f"{LOCKED}.*"])
    from orchestrator.pipeline.plan import step as planning

    def source_restarting(*args: Any, **kwargs: Any) -> Any:  # after the checks, in planning
        raise ConnectionRefusedError("simulated: connection refused (the source is restarting)")

    monkeypatch.setattr(planning, "find_tables", source_restarting)
    run = load_dag_of(monkeypatch, configs, f"tidemark_{LOCKED}").test()

    states = task_states(run)
    assert run.state == "failed" and states["plan[-1]"] == "failed", states
    store = state(tmp_path)
    try:
        assert store.runs(LOCKED) == [], "plan failed before it started a run"
        assert store.lock_info(LOCKED) is None, "the failed plan kept the pipeline lock"
    finally:
        store.close()


def test_a_plan_refused_by_another_runs_lock_leaves_that_lock_alone(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_tables(mariadb, LOCKED)
    configs = pipeline(monkeypatch, tmp_path, mariadb, LOCKED, [f"{LOCKED}.t1"])
    store = state(tmp_path)
    try:
        other = store.acquire_lock(
            LOCKED, "airflow:tidemark_other/manual__1", lease_seconds=900, track_pid=False
        )
    finally:
        store.close()

    run = load_dag_of(monkeypatch, configs, f"tidemark_{LOCKED}").test()

    states = task_states(run)
    assert run.state == "failed" and states["plan[-1]"] == "failed", states
    store = state(tmp_path)
    try:
        lock = store.lock_info(LOCKED)
        assert lock is not None and lock.holder == other.holder
        with pytest.raises(RunLocked):  # still live: a second run is refused
            store.acquire_lock(
                LOCKED, "airflow:tidemark_third/manual__1", lease_seconds=900, track_pid=False
            )
    finally:
        store.close()


# ------------------------------------------------------------------ a run that keeps failing

ESCAPE = "tm_dagescape"


def test_a_snapshot_trigger_leaves_a_failed_run_behind(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger with ``snapshot: true`` does what it asks while a failed run of the same tables
    exists, as ``tidemark run --snapshot`` does: that run is left behind and a new one snapshots
    them (before, every trigger resumed the failed run whatever its params)."""
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    create_tables(mariadb, ESCAPE)
    configs = pipeline(monkeypatch, tmp_path, mariadb, ESCAPE)
    lake = tmp_path / "lake"
    blocker = lake / ESCAPE / "t2"  # a file where t2's output directory belongs: its publish fails
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")
    failed = load_dag_of(monkeypatch, configs, f"tidemark_{ESCAPE}").test()
    assert failed.state == "failed", task_states(failed)
    blocker.unlink()
    store = state(tmp_path)
    try:
        (old,) = store.runs(ESCAPE)
    finally:
        store.close()

    again = load_dag_of(monkeypatch, configs, f"tidemark_{ESCAPE}").test(
        run_conf={"snapshot": True}
    )

    assert again.state == "success", task_states(again)
    store = state(tmp_path)
    try:
        runs = {r.run_id: r.status for r in store.runs(ESCAPE)}
    finally:
        store.close()
    assert runs.pop(old.run_id) == "failed", "the failed run is left behind"
    (new,) = runs
    for table in (f"{ESCAPE}.t1", f"{ESCAPE}.t2"):
        assert manifest(lake, table)["run_id"] == new, f"{table} is the new run's snapshot"  # type: ignore[index]
        assert published_rows(lake, table) == source_rows(mariadb, table)


def test_more_batches_than_airflow_maps_fail_plan_saying_so_and_a_raised_limit_resumes(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before, Airflow's API server refused ``plan``'s return value ("pushed value is too large
    to map") at every retry, naming neither the limit nor the fix: a pipeline of many batches
    (a large table, a small ``chunk_size``) could never snapshot under Airflow."""
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    create_tables(mariadb, MAPPED)
    t1 = f"{MAPPED}.t1"
    configs = pipeline(monkeypatch, tmp_path, mariadb, MAPPED, [t1])  # two batches
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "1")
    refused = load_dag_of(monkeypatch, configs, f"tidemark_{MAPPED}").test()

    states = task_states(refused)
    assert refused.state == "failed" and states["plan[-1]"] == "failed", states
    assert states["read[-1]"] == "upstream_failed", states
    out, err = capfd.readouterr()
    assert "has 2 batches to read" in out + err and "max_map_length = 1" in out + err
    assert "pushed value is too large" not in out + err
    store = state(tmp_path)
    try:
        (planned,) = store.runs(MAPPED)
        assert store.lock_info(MAPPED) is None, "the refused plan kept the pipeline lock"
    finally:
        store.close()
    assert manifest(tmp_path / "lake", t1) is None

    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "2")
    resumed = load_dag_of(monkeypatch, configs, f"tidemark_{MAPPED}").test()

    assert resumed.state == "success", task_states(resumed)
    assert sorted(k for k in task_states(resumed) if k.startswith("read")) == ["read[0]", "read[1]"]
    assert published_rows(tmp_path / "lake", t1) == source_rows(mariadb, t1)
    assert manifest(tmp_path / "lake", t1)["run_id"] == planned.run_id  # type: ignore[index]
