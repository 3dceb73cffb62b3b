"""The shape of a pipeline's DAG: tasks and their order, mapping, pool, params, assets, retries."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.dags.sources import REPO
from tests.dags.test_parsing import config, parse, write

pytestmark = pytest.mark.usefixtures("airflow_home")

ORDER = ["plan", "read", "capture", "reconcile", "publish", "outcome"]


@pytest.fixture
def dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = tmp_path / "configs"
    write(folder, "shop.yaml", config("shop", tmp_path, schedule="15 3 * * *"))
    bag = parse(monkeypatch, folder)
    assert bag.import_errors == {}
    return bag.dags["tidemark_shop"]


def test_tasks_run_in_order(dag: Any) -> None:
    assert sorted(dag.task_ids) == sorted(ORDER)
    assert [t.task_id for t in dag.topological_sort()] == ORDER
    for upstream, downstream in itertools.pairwise(ORDER):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    assert dag.get_task("plan").upstream_task_ids == set()


def test_read_is_mapped_over_batches_and_labelled(dag: Any) -> None:
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    read = dag.get_task("read")
    assert isinstance(read, MappedOperator)
    assert list(read.op_kwargs_expand_input.value) == ["batch"]
    assert [t.task_id for t in read.iter_mapped_dependencies()] == ["plan"]
    assert read.map_index_template == "{{ task.op_kwargs['batch']['label'] }}"
    assert not isinstance(dag.get_task("capture"), MappedOperator)
    assert dag.get_task("capture").trigger_rule == "none_failed"  # zero batches skip read


def test_outcome_runs_after_a_publish_that_plan_skipped(dag: Any) -> None:
    """A run with nothing to read is published by ``plan``, which skips ``publish``; when tables
    failed on their own it leaves ``outcome`` to fail the DAG run, so a skipped ``publish`` must
    not skip ``outcome`` (a failed one still does: none_failed)."""
    assert dag.get_task("outcome").trigger_rule == "none_failed"


def test_source_tasks_share_the_pipeline_pool(dag: Any) -> None:
    pools = {t.task_id: t.pool for t in dag.tasks}
    for task_id in ("plan", "read", "capture"):
        assert pools[task_id] == "tidemark_shop_source"
    assert pools["reconcile"] == pools["publish"] == pools["outcome"] == "default_pool"


def test_dag_settings_come_from_the_config(dag: Any) -> None:
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert dag.timetable.expression == "15 3 * * *"
    assert set(dag.tags) == {"tidemark", "shop"}
    assert "`shop.orders`" in dag.doc_md and "`shop.customers`" in dag.doc_md
    for task in dag.tasks:
        assert task.retries == 2 and task.retry_delay == timedelta(minutes=1)
        assert task.retry_policy is not None


def test_every_task_has_an_execution_timeout_from_read_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "configs"
    data = config("slow", tmp_path, defaults={"batch_chunks": 4, "read_attempts": 2})
    data["source"]["read_timeout"] = 30
    write(folder, "slow.yaml", data)
    bag = parse(monkeypatch, folder)
    assert bag.import_errors == {}
    limits = {t.task_id: t.execution_timeout for t in bag.dags["tidemark_slow"].tasks}
    assert limits == {
        # the source's checks, planning, and a run with nothing to read captured, reconciled
        # and published
        "plan": timedelta(minutes=3 + 3 + 3 * 24),
        # a batch of 256 small tables read 8 at a time: 32 rounds, more than 4 chunks
        "read": timedelta(seconds=(32 * 2 + 1) * 30),
        "capture": timedelta(minutes=24),
        "reconcile": timedelta(minutes=24),
        "publish": timedelta(minutes=24),
        "outcome": timedelta(minutes=3),
    }


def test_params_have_form_metadata_and_the_tables_as_choices(dag: Any) -> None:
    params = {name: dag.params.get_param(name) for name in ("tables", "snapshot", "chunk_size")}
    tables = params["tables"].schema
    assert "array" in tables["type"]
    assert tables["items"] == {"type": "string", "enum": ["shop.orders", "shop.customers"]}
    assert tables["examples"] == ["shop.orders", "shop.customers"]
    assert params["tables"].value == []
    # boolean or null: the trigger form marks a param required (*) when its type excludes null
    assert (
        params["snapshot"].schema["type"] == ["boolean", "null"]
        and params["snapshot"].value is False
    )
    assert params["chunk_size"].schema["type"] == ["null", "integer"]
    assert params["chunk_size"].schema["minimum"] == 1 and params["chunk_size"].value is None
    assert (
        params["chunk_size"].schema["maximum"] == 2**31 - 1
    )  # a chunk bound's OFFSET; 10**30 failed planning
    for param in params.values():
        assert param.schema["title"] and param.description


@pytest.mark.parametrize(
    "conf",
    [
        {"tables": ["nope.nope"]},
        {"tables": "shop.orders"},
        {"chunk_size": 0},
        {"chunk_size": "big"},
        {"snapshot": "yes"},
        {"chunk_size": 10**30},
        {"chunk_size": 2**31},
    ],
)
def test_invalid_params_are_refused_by_the_serialized_dag(dag: Any, conf: dict[str, Any]) -> None:
    """What the API server validates a trigger against is the serialized DAG's params."""
    from airflow.exceptions import ParamValidationError
    from airflow.serialization.serialized_objects import DagSerialization

    served = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    served.params.deep_merge({"tables": ["shop.orders"], "chunk_size": 10}).validate()
    served.params.deep_merge({"chunk_size": 2**31 - 1}).validate()
    with pytest.raises(ParamValidationError):
        served.params.deep_merge(conf).validate()


def test_publish_declares_one_asset_per_table(dag: Any, tmp_path: Path) -> None:
    outlets = dag.get_task("publish").outlets
    assert [a.uri for a in outlets] == [
        f"file://{tmp_path}/lake/shop/orders",
        f"file://{tmp_path}/lake/shop/customers",
    ]
    assert all(not t.outlets for t in dag.tasks if t.task_id not in ("plan", "publish"))


def test_plan_declares_an_alias_and_no_asset(dag: Any) -> None:
    """``plan`` publishes a run with nothing to read and announces its tables through an alias;
    an Asset declared on it would get an event from every ``plan`` that succeeds, a snapshot's
    too, before anything is published."""
    from airflow.sdk import AssetAlias

    outlets = dag.get_task("plan").outlets
    assert outlets == [AssetAlias("tidemark_shop:caught-up")]


def test_the_shipped_example_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = parse(monkeypatch, REPO / "configs")
    shop = bag.dags["tidemark_shop"]
    assert all(a.uri.startswith("file:///") for a in shop.get_task("publish").outlets)
