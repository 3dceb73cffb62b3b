"""End to end in real Airflow: its own api-server, scheduler and dag-processor, the REST API, the
UI.

One Airflow for the module (see `tests.e2e.stack`), one private MariaDB with two
tiny tables, a configs folder with the pipeline and one broken config. The
source password lives only in an Airflow connection created through the API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from tests.dags.sources import (
    SOURCE_PASSWORD,
    SOURCE_USER,
    create_tables,
    engine_missing,
    manifest,
    published_rows,
    source_rows,
    write_pipeline,
)
from tests.e2e.stack import AirflowStack, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DB = "tm_e2e"
DAG_ID = f"tidemark_{DB}"
CONN_ID = "tidemark_e2e_source"
RUN_TIMEOUT = 900  # seconds for one DAG run on a busy 2-core machine
#: Titles and descriptions of the three params, as the trigger form must show them.
PARAM_TEXTS = (
    "Tables",
    "Re-snapshot",
    "Chunk size",
    "Tables for this run (empty: all; a pattern: all it matches)",
    "Snapshot the chosen tables again",
    "Target rows per chunk",
)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def source(mariadb: LocalMariaDB, work: Path) -> LocalMariaDB:
    create_tables(mariadb, DB)
    configs = work / "configs"
    write_pipeline(configs, work, mariadb, DB, CONN_ID)
    (configs / "broken.yaml").write_text(
        "pipeline: broken\nsource: {host: h, user: u, server_id: 1}\n"
        f"output: {{path: {work}/x}}\nstate: {{url: 'sqlite:////{work}/x.db'}}\n"
        "tables: [{name: no_database_part}]\n"
    )
    return mariadb


@pytest.fixture(scope="module")
def airflow(source: LocalMariaDB, work: Path) -> Iterator[AirflowStack]:
    home = work / "airflow"
    home.mkdir()
    stack = AirflowStack(home=home, extra_env={"TIDEMARK_CONFIG_DIR": str(work / "configs")})
    try:
        stack.start()
        yield stack
    except Exception:
        for name in ("api-server", "scheduler", "dag-processor"):
            print(f"--- airflow {name} log ---\n{stack.log_tail(name)}")
        raise
    finally:
        stack.stop()


def wait_for_dag(airflow: AirflowStack) -> dict[str, Any]:
    def listed() -> dict[str, Any] | None:
        airflow.check_alive()
        response = airflow.api("GET", f"/dags/{DAG_ID}", expect=None)
        return response.json() if response.status_code == 200 else None  # type: ignore[no-any-return]

    return wait_for(f"the dag-processor to load {DAG_ID}", listed, timeout=300, interval=2)


def test_dag_loads_and_a_broken_config_is_its_own_import_error(
    airflow: AirflowStack, work: Path
) -> None:
    dag = wait_for_dag(airflow)
    assert dag["has_import_errors"] is False and dag["is_stale"] is False
    assert {t["name"] for t in dag["tags"]} == {"tidemark", DB}

    def reported() -> list[dict[str, Any]] | None:
        errors = airflow.api("GET", "/importErrors").json()["import_errors"]
        return errors or None

    errors = wait_for("the import error of the broken config", reported, timeout=120, interval=2)
    assert [e["filename"] for e in errors] == ["tidemark_config_errors.py"]
    trace = errors[0]["stack_trace"]
    assert f"{work / 'configs' / 'broken.yaml'}: tables[0].name: expected `database.table`" in trace


@pytest.mark.parametrize(
    "conf", [{"tables": ["nope.nope"]}, {"chunk_size": 0}, {"snapshot": "yes"}]
)
def test_a_trigger_with_an_invalid_param_is_refused(
    airflow: AirflowStack, conf: dict[str, Any]
) -> None:
    wait_for_dag(airflow)
    response = airflow.api(
        "POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}, expect=None
    )
    assert response.status_code == 400, response.text
    assert "Invalid input for param" in response.text
    runs = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns").json()
    assert runs["total_entries"] == 0 or all(r["conf"] != conf for r in runs["dag_runs"])


def trigger_and_wait(
    airflow: AirflowStack, conf: dict[str, Any]
) -> tuple[str, str, list[dict[str, Any]]]:
    """Trigger a DAG run with ``conf`` and wait for it: its id, final state and task instances."""
    run_id = str(
        airflow.api(
            "POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}
        ).json()["dag_run_id"]
    )

    def finished() -> str | None:
        airflow.check_alive()
        state = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
        return str(state) if state in ("success", "failed") else None

    state = wait_for(f"DAG run {run_id}", finished, timeout=RUN_TIMEOUT, interval=3)
    tis = airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()[
        "task_instances"
    ]
    return run_id, state, tis


def test_trigger_with_params_runs_to_success_and_publishes(
    airflow: AirflowStack, source: LocalMariaDB, work: Path
) -> None:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    wait_for_dag(airflow)
    airflow.api(
        "POST",
        "/pools",
        json={
            "name": f"tidemark_{DB}_source",
            "slots": 4,
            "description": "Tidemark e2e: source connections",
        },
        expect=201,
    )
    airflow.api(
        "POST",
        "/connections",
        expect=201,
        json={
            "connection_id": CONN_ID,
            "conn_type": "mysql",
            "host": "127.0.0.1",
            "port": source.port,
            "login": SOURCE_USER,
            "password": SOURCE_PASSWORD,
        },
    )
    airflow.api("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})
    t1 = f"{DB}.t1"

    run_id, state, tis = trigger_and_wait(airflow, {"tables": [t1]})
    summary = {(t["task_id"], t["map_index"]): t["state"] for t in tis}
    assert state == "success", summary
    assert summary.pop(("outcome", -1)) == "skipped", summary  # no table failed
    assert set(summary.values()) == {"success"}, summary

    lake = work / "lake"
    assert published_rows(lake, t1) == source_rows(source, t1)
    assert manifest(lake, t1)["rows"] == 300  # type: ignore[index]
    assert manifest(lake, f"{DB}.t2") is None
    reads = [t for t in tis if t["task_id"] == "read"]
    assert len(reads) == 2 and all(t["rendered_map_index"].startswith(t1) for t in reads)
    events = airflow.api("GET", f"/assets/events?source_dag_id={DAG_ID}").json()["asset_events"]
    extras = {e["uri"]: e["extra"] for e in events if e["source_run_id"] == run_id}
    assert extras[f"file://{lake}/{DB}/t1"]["rows"] == 300, events
    assert extras[f"file://{lake}/{DB}/t2"]["published"] is False, events

    # An incremental run: nothing to read, so plan captures, reconciles and publishes, one task
    source.execute(f"UPDATE {t1} SET qty = qty + 7 WHERE id <= 3", f"DELETE FROM {t1} WHERE id = 4")
    again, state, tis = trigger_and_wait(airflow, {"tables": [t1]})
    summary = {(t["task_id"], t["map_index"]): t["state"] for t in tis}
    assert state == "success", summary
    assert summary == {
        ("plan", -1): "success",
        **{
            (task, -1): "skipped" for task in ("read", "capture", "reconcile", "publish", "outcome")
        },
    }
    assert published_rows(lake, t1) == source_rows(source, t1)
    assert manifest(lake, t1)["rows"] == 299  # type: ignore[index]
    events = airflow.api("GET", f"/assets/events?source_dag_id={DAG_ID}").json()["asset_events"]
    extras = {e["uri"]: e["extra"] for e in events if e["source_run_id"] == again}
    assert extras[f"file://{lake}/{DB}/t1"]["published"] is True, events
    assert extras[f"file://{lake}/{DB}/t1"]["version"] == 2, events

    logs = [p for p in (airflow.home / "logs").rglob("*") if p.is_file()]
    assert any("read" in str(p) for p in logs), "no task logs to check"
    for log in logs:
        assert SOURCE_PASSWORD not in log.read_text(errors="replace"), f"password in {log}"


def test_trigger_form_shows_the_params(airflow: AirflowStack, work: Path) -> None:
    from tests.e2e.browser import chromium_page, find_chromium, wait_for_js

    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian package chromium; .ci/setup installs it)")
    pytest.importorskip("websockets.sync.client")
    wait_for_dag(airflow)
    with chromium_page(binary) as page:
        page.goto(f"{airflow.base_url}/dags/{DAG_ID}")
        try:
            wait_for_js(
                page,
                "the DAG page's trigger button",
                "!!document.querySelector('[data-testid=\"trigger-dag-button\"]')",
            )
            page.evaluate("document.querySelector('[data-testid=\"trigger-dag-button\"]').click()")
            text = wait_for_js(
                page,
                "the trigger form with the params",
                "(() => { const t = document.body.innerText; return "
                + " && ".join(f"t.includes({json.dumps(title)})" for title in PARAM_TEXTS)
                + " ? t : null; })()",
            )
        finally:
            page.screenshot(work / "trigger-form.png")
    for title in PARAM_TEXTS:
        assert title in text
