"""A pipeline of table patterns under Airflow (issue 16): the DAG of a pattern matching 500 tables
parses, its trigger form lists the tables the pattern last matched (read from the state store,
never written at parse time) and the pattern itself, and the publish task's outlet for the
pattern is an AssetAlias its tables' Assets join."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config.patterns import PatternMatch
from orchestrator.state.store import StateStore
from tests.dags.test_parsing import config, parse, write

pytestmark = pytest.mark.usefixtures("airflow_home")

TABLES = [f"many.t{i:04d}" for i in range(500)]


def test_a_dag_of_500_matched_tables_parses_and_its_form_lists_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.exceptions import ParamValidationError
    from airflow.sdk import AssetAlias
    from airflow.serialization.serialized_objects import DagSerialization

    data = config(
        "many",
        tmp_path,
        tables=[{"name": "many.*", "exclude": ["many.tmp_*"]}, {"name": "shop.orders"}],
    )
    folder = tmp_path / "configs"
    write(folder, "many.yaml", data)
    with StateStore(data["state"]["url"]) as store:  # what planning a run records
        store.save_table_set("many", "r1", [PatternMatch("many.*", 0, tuple(TABLES)).to_json()], [])
    state_db = tmp_path / "state.db"
    before = state_db.stat().st_mtime_ns

    started = time.perf_counter()
    bag = parse(monkeypatch, folder)
    seconds = time.perf_counter() - started
    assert bag.import_errors == {}
    dag = bag.dags["tidemark_many"]
    print(f"parsed the DAG of {len(TABLES)} matched tables in {seconds:.2f}s")
    assert state_db.stat().st_mtime_ns == before, "parsing wrote nothing to the state store"

    tables = dag.params.get_param("tables").schema
    assert tables["items"]["enum"] == ["many.*", "shop.orders", *TABLES]
    assert tables["examples"] == tables["items"]["enum"]
    served = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    served.params.deep_merge({"tables": ["many.*", "many.t0499", "shop.orders"]}).validate()
    with pytest.raises(ParamValidationError):
        served.params.deep_merge({"tables": ["many.t0500"]}).validate()

    outlets: list[Any] = dag.get_task("publish").outlets
    assert [o.uri for o in outlets if not isinstance(o, AssetAlias)] == [
        f"file://{tmp_path}/lake/shop/orders"
    ]
    assert [o.name for o in outlets if isinstance(o, AssetAlias)] == ["tidemark_many:many.*"]


def test_without_a_recorded_table_set_the_form_offers_the_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "configs"
    write(folder, "many.yaml", config("many", tmp_path, tables=[{"name": "many.*"}]))
    bag = parse(monkeypatch, folder)
    assert bag.import_errors == {}
    assert bag.dags["tidemark_many"].params.get_param("tables").schema["items"]["enum"] == [
        "many.*"
    ]
    assert not (tmp_path / "state.db").exists(), "parsing creates no state store"


PATTERN_DB = "tm_dagpat"


@pytest.mark.integration
@pytest.mark.slow
def test_a_dag_run_of_a_pattern_adds_each_table_to_the_alias(
    mariadb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dag.test()`` of a pattern entry against a real MariaDB and local Spark: both tables are
    read in one packed batch (one mapped read task), published, and their Assets' events are
    added through the pattern's AssetAlias with the published extra; then a run with nothing to
    read, done by ``plan`` alone, adds its events through the same alias."""
    from airflow.models.asset import AssetAliasModel, AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from tests.dags.sources import (
        connection_json,
        create_tables,
        published_rows,
        source_rows,
        write_pipeline,
    )
    from tests.dags.test_dag_run import load_dag_of, task_states

    create_tables(mariadb, PATTERN_DB, rows=50)
    configs, lake = tmp_path / "configs", tmp_path / "lake"
    path = write_pipeline(configs, tmp_path, mariadb, PATTERN_DB, "tidemark_dagpat_source")
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "tables": [{"name": f"{PATTERN_DB}.*"}]}))
    monkeypatch.setenv("AIRFLOW_CONN_TIDEMARK_DAGPAT_SOURCE", connection_json(mariadb))

    run = load_dag_of(monkeypatch, configs, f"tidemark_{PATTERN_DB}").test()

    states = task_states(run)
    assert run.state == "success", states
    assert [k for k in states if k.startswith("read[")] == ["read[0]"], (
        "two small tables, one batch"
    )
    tables = [f"{PATTERN_DB}.t1", f"{PATTERN_DB}.t2"]
    for table in tables:
        assert published_rows(lake, table) == source_rows(mariadb, table)
    with create_session() as session:
        events = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_run_id == run.run_id)
        ).all()
        aliases = session.scalars(select(AssetAliasModel.name)).all()
    assert f"tidemark_{PATTERN_DB}:{PATTERN_DB}.*" in aliases
    extras = {uri: extra for uri, extra in events}
    for table in tables:
        extra = extras[f"file://{lake}/{table.replace('.', '/')}"]
        assert extra["published"] is True and extra["table"] == table and extra["rows"] == 50

    # A run with nothing to read is done by plan, whose events join the pattern's alias too.
    mariadb.execute(f"UPDATE {tables[0]} SET qty = 99 WHERE id = 1")
    again = load_dag_of(monkeypatch, configs, f"tidemark_{PATTERN_DB}").test()

    states = task_states(again)
    assert again.state == "success", states
    assert states.pop("plan[-1]") == "success" and set(states.values()) == {"skipped"}, states
    for table in tables:
        assert published_rows(lake, table) == source_rows(mariadb, table)
    with create_session() as session:
        found = {
            event.asset.uri: (event.extra, [a.name for a in event.source_aliases])
            for event in session.scalars(
                select(AssetEvent).where(AssetEvent.source_run_id == again.run_id)
            )
        }
    alias = f"tidemark_{PATTERN_DB}:{PATTERN_DB}.*"
    changed, kept = (found[f"file://{lake}/{t.replace('.', '/')}"] for t in tables)
    assert changed[0]["published"] is True and changed[0]["version"] == 2 and changed[1] == [alias]
    assert kept[0]["published"] is False and kept[0]["version"] == 1 and kept[1] == [alias]
