"""``dag.test()`` against a real private MariaDB and local Spark, credentials from an Airflow
connection.

First an ad hoc run (``tables`` param) snapshots only the table it names; then a
run without params snapshots the other table and applies the binlog to the
first; its publish fails, and the next DAG run resumes it with nothing left to read; a last
run applies the binlog to both. A run with nothing to read is published by ``plan``, which
skips the tasks after it. Each published table equals its source, the mapped reads carry their
batch labels, the asset events carry rows and position, and the source password
is in no XCom, rendered field or log line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.dags.sources import (
    REPO,
    SOURCE_PASSWORD,
    connection_json,
    create_tables,
    engine_missing,
    manifest,
    published_rows,
    source_rows,
    write_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]

DB = "tm_dagtest"
CONN_ID = "tidemark_dagtest_source"


def load_dag(monkeypatch: pytest.MonkeyPatch, configs: Path) -> Any:
    return load_dag_of(monkeypatch, configs, f"tidemark_{DB}")


def load_dag_of(monkeypatch: pytest.MonkeyPatch, configs: Path, dag_id: str) -> Any:
    from airflow.dag_processing.dagbag import BundleDagBag

    monkeypatch.setenv("TIDEMARK_CONFIG_DIR", str(configs))
    dags = REPO / "dags"
    bag = BundleDagBag(dag_folder=dags, bundle_path=dags, bundle_name="dags-folder")
    assert bag.import_errors == {}
    dag = bag.dags[dag_id]
    for task in dag.tasks:
        task.retries = 0  # a failure fails the test now, not after the retry delays
    return dag


def task_states(run: Any) -> dict[str, str]:
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()}


#: The tasks `plan` skips when it publishes a run with nothing to read (no table failing).
DONE_IN_PLAN = {
    f"{task}[-1]": "skipped" for task in ("read", "capture", "reconcile", "publish", "outcome")
}


def stored_values(run_id: str) -> dict[str, Any]:
    """What Airflow stored for the run: XComs, rendered fields, mapped labels, asset events."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag_id = f"tidemark_{DB}"
    with create_session() as session:
        xcoms = session.execute(
            select(XComModel.task_id, XComModel.key, XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.run_id == run_id
            )
        ).all()
        rendered = session.scalars(
            select(RenderedTaskInstanceFields.rendered_fields).where(
                RenderedTaskInstanceFields.dag_id == dag_id,
                RenderedTaskInstanceFields.run_id == run_id,
            )
        ).all()
        labels = session.scalars(
            select(TaskInstance.rendered_map_index).where(
                TaskInstance.dag_id == dag_id,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == "read",
            )
        ).all()
        events = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
    return {
        "xcom": [(t, k, v) for t, k, v in xcoms],
        "rendered": list(rendered),
        "labels": sorted(labels),
        "events": {uri: extra for uri, extra in events},
    }


@pytest.mark.parametrize(
    "conf, key", [({"tabels": [f"{DB}.t1"]}, "'tabels'"), ({"bogus": 1}, "'bogus'")]
)
def test_unknown_conf_key_fails_the_run_before_any_read(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    conf: dict[str, Any],
    key: str,
) -> None:
    configs, lake = tmp_path / "configs", tmp_path / "lake"
    write_pipeline(configs, tmp_path, mariadb, DB, CONN_ID)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(mariadb))

    run = load_dag(monkeypatch, configs).test(run_conf=conf)

    states = task_states(run)
    assert run.state == "failed", states
    assert states["plan[-1]"] == "failed" and states["read[-1]"] == "upstream_failed", states
    assert not lake.exists(), "nothing may be read or published"
    out, err = capfd.readouterr()
    assert f"run conf: unknown key {key}; valid keys: tables, snapshot, chunk_size" in out + err


def test_ad_hoc_snapshot_then_binlog_run(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    create_tables(mariadb, DB)
    configs, lake = tmp_path / "configs", tmp_path / "lake"
    write_pipeline(configs, tmp_path, mariadb, DB, CONN_ID)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_json(mariadb))
    dag = load_dag(monkeypatch, configs)
    t1, t2 = f"{DB}.t1", f"{DB}.t2"

    first = dag.test(run_conf={"tables": [t1]})

    assert first.state == "success", task_states(first)
    first_states = task_states(first)  # no table failed: publish skips outcome, one process less
    assert first_states.pop("outcome[-1]") == "skipped", first_states
    assert set(first_states.values()) == {"success"}, first_states
    first_out, first_err = capfd.readouterr()
    noisy = [line for line in (first_out + first_err).splitlines() if "ERROR" in line]
    assert noisy == [], (
        "a successful run logs no ERROR line (the JVM's output goes to the log at INFO)"
    )
    assert published_rows(lake, t1) == source_rows(mariadb, t1)
    assert manifest(lake, t2) is None, "an ad hoc run of t1 must not touch t2"
    stored = stored_values(first.run_id)
    assert len(stored["labels"]) == 2 and all(label.startswith(t1) for label in stored["labels"])
    uri1, uri2 = (f"file://{lake}/{DB}/{t}" for t in ("t1", "t2"))
    assert stored["events"][uri1]["rows"] == 300
    assert stored["events"][uri1]["iceberg"] == manifest(lake, t1)["iceberg"]  # type: ignore[index]
    position = manifest(lake, t1)["position"]  # type: ignore[index]
    assert {k: stored["events"][uri1]["position"][k] for k in ("file", "pos")} == {
        k: position[k] for k in ("file", "pos")
    }
    assert stored["events"][uri2]["published"] is False
    run_ids = {v for _, k, v in stored["xcom"] if k == "run_id"}
    assert len(run_ids) == 1

    mariadb.execute(
        f"UPDATE {t1} SET qty = 999, name = 'changed' WHERE id <= 10",
        f"DELETE FROM {t1} WHERE id BETWEEN 11 AND 20",
        f"INSERT INTO {t1} VALUES (1001, 'new', NULL), (1002, 'newer', 5)",
    )

    # A file where t2's output directory belongs makes this run's publish fail after t1.
    blocker = lake / DB / "t2"
    blocker.write_text("in the way")
    # In-process dag.test() resolves run conf into the DAG object's own Param objects (a real
    # worker parses the DAG file afresh for every task), so every run gets a fresh parse.
    failed = load_dag(monkeypatch, configs).test()

    assert failed.state == "failed", task_states(failed)
    assert task_states(failed)["publish[-1]"] == "failed"
    assert manifest(lake, t1)["version"] == 2  # type: ignore[index]
    blocker.unlink()

    # A new DAG run (a new lock holder): the failed run released the lock, so this one resumes it.
    second = load_dag(monkeypatch, configs).test()

    assert second.state == "success", task_states(second)
    # every chunk was read by the failed run: plan captures, reconciles and publishes, one task
    assert task_states(second) == {
        "plan[-1]": "success",
        **DONE_IN_PLAN,
    }
    assert published_rows(lake, t1) == source_rows(mariadb, t1)
    assert published_rows(lake, t2) == source_rows(mariadb, t2)
    assert manifest(lake, t1)["version"] == 2  # type: ignore[index]
    assert manifest(lake, t2)["version"] == 1  # type: ignore[index]
    assert manifest(lake, t2)["run_id"] == manifest(lake, t1)["run_id"]  # type: ignore[index]
    failed_values, later = stored_values(failed.run_id), stored_values(second.run_id)
    assert failed_values["events"] == {}, "a failed publish emits no asset event"
    assert failed_values["labels"] and all(
        label.startswith(t2) for label in failed_values["labels"]
    )
    assert later["events"][uri1]["rows"] == 292 and later["events"][uri2]["rows"] == 300
    assert later["events"][uri2]["published"] is True

    # An incremental run of both tables: nothing to read, published in plan.
    mariadb.execute(
        f"UPDATE {t2} SET qty = qty + 1 WHERE id <= 5",
        f"DELETE FROM {t1} WHERE id = 1001",
    )
    third = load_dag(monkeypatch, configs).test()

    assert third.state == "success", task_states(third)
    assert task_states(third) == {
        "plan[-1]": "success",
        **DONE_IN_PLAN,
    }
    assert published_rows(lake, t1) == source_rows(mariadb, t1)
    assert published_rows(lake, t2) == source_rows(mariadb, t2)
    last = stored_values(third.run_id)
    assert manifest(lake, t1)["version"] == 3  # type: ignore[index]
    assert last["events"][uri1]["rows"] == 291 and last["events"][uri1]["published"] is True
    assert last["events"][uri2]["version"] == 2 and last["events"][uri2]["published"] is True

    out, err = capfd.readouterr()
    out = first_out + first_err + out
    for what, value in (
        ("XCom", stored["xcom"] + failed_values["xcom"] + later["xcom"] + last["xcom"]),
        (
            "rendered fields",
            stored["rendered"] + failed_values["rendered"] + later["rendered"] + last["rendered"],
        ),
        ("asset events", [stored["events"], later["events"], last["events"]]),
        ("output", out + err),
    ):
        assert SOURCE_PASSWORD not in json.dumps(value, default=str), f"password leaked into {what}"
