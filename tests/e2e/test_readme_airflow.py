"""README "Running with Airflow", run as written: the documentation cannot drift from what works.

The test takes the two ``bash`` blocks of that section from README.md itself and
runs them as a user would, from a fresh checkout layout (``dags/`` and ``.venv``
of this repo, ``configs/shop.yaml`` pointing at a private MariaDB) and a fresh
shell environment: no virtualenv on PATH, no Airflow variables, HOME empty.
Shell 1 (set-up, then ``airflow standalone`` in the foreground) runs in its own
process group and gets the password on stdin; shell 2 prints the login and
triggers a run. The test logs in with the password from where the README says it
is, watches the run through the REST API, then, as a user of the UI would, signs
in with Chromium, picks one table in the trigger form and clicks Trigger (a
binlog catch-up of that table only), triggers a misspelt param through the REST
API, and stops Airflow with Ctrl+C (SIGINT to shell 1's process group), as the
README says.

Three things differ from a user's machine, none of them in the commands: the API
port is a free one (``AIRFLOW__API__PORT``/``BASE_URL``), ``PYTHONPATH`` names this
checkout (the venv's editable install may point at another one), and the source
password is typed by the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.app.demo.localdb import LocalMariaDB, free_port
from tests.dags.airflow_home import REPO, VENV_BIN
from tests.dags.sources import (
    SOURCE_PASSWORD,
    SOURCE_USER,
    engine_missing,
    manifest,
    published_rows,
    source_rows,
)
from tests.e2e.browser import Page, chromium_page, find_chromium, wait_for_js
from tests.e2e.stack import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAG_ID = "tidemark_shop"
TABLE = "shop.orders"
OTHER = "shop.items"  # in the config, never chosen: it must stay unpublished
SECTION = "## Running with Airflow"


def readme_blocks() -> dict[str, str]:
    """The section's ``bash`` blocks by their first line's label:
    ``{"shell 1": ..., "shell 2": ...}``."""
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    section = text[start : text.find("\n## ", start + len(SECTION))]
    blocks = {}
    for body in re.findall(r"^```bash\n(.*?)^```$", section, flags=re.S | re.M):
        label = re.match(r"# (shell \d+)", body)
        if label:
            blocks[label.group(1)] = body
    assert set(blocks) == {"shell 1", "shell 2"}, f"README {SECTION}: expected shell 1 and 2 blocks"
    return blocks


@pytest.fixture
def checkout(tmp_path: Path, mariadb: LocalMariaDB) -> Path:
    """A fresh checkout's layout: this repo's dags/ and .venv, configs/shop.yaml for the private
    source."""
    mariadb.create_user(SOURCE_USER, SOURCE_PASSWORD)
    mariadb.execute(
        "DROP DATABASE IF EXISTS shop",
        "CREATE DATABASE shop",
        "CREATE TABLE shop.orders (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
        "qty INT NULL) ENGINE=InnoDB",
        "INSERT INTO shop.orders VALUES "
        + ", ".join(f"({i}, 'order-{i}', {i % 13})" for i in range(1, 301)),
        f"CREATE TABLE {OTHER} (id INT PRIMARY KEY, name VARCHAR(40) NOT NULL, qty INT NULL) "
        "ENGINE=InnoDB",
        f"INSERT INTO {OTHER} VALUES (1, 'item-1', 1), (2, 'item-2', NULL)",
    )
    root = tmp_path / "tidemark"
    (root / "configs").mkdir(parents=True)
    (root / "dags").symlink_to(REPO / "dags")
    (root / ".venv").symlink_to(VENV_BIN.parent)
    (root / "configs" / "shop.yaml").write_text(
        yaml.safe_dump(
            {
                "pipeline": "shop",
                "source": {
                    "host": "127.0.0.1",
                    "port": mariadb.port,
                    "user": SOURCE_USER,
                    "password_env": "SHOP_MYSQL_PASSWORD",
                    "server_id": 54101,
                },
                "spark": {
                    "master": "local[2]",
                    "conf": {
                        "spark.driver.memory": "1g",
                        "spark.ui.enabled": "false",
                        "spark.sql.shuffle.partitions": "2",
                    },
                },
                "output": {"path": str(tmp_path / "lake")},
                "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
                "tables": [{"name": TABLE}, {"name": OTHER}],
            }
        )
    )
    (tmp_path / "home").mkdir()
    return root


def fresh_env(home: Path, port: int) -> dict[str, str]:
    env = {
        "HOME": str(home),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
    }
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


@contextlib.contextmanager
def shell_one(
    script: str, cwd: Path, env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Shell 1 in its own process group (a terminal's job); the password typed on stdin.

    SIGINT is reset to its default first, as in a terminal: a pytest started in the
    background (``&``) ignores it, and ``airflow standalone`` would inherit that and
    never see Ctrl+C.
    """
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    assert process.stdin is not None
    process.stdin.write(f"{SOURCE_PASSWORD}\n".encode())
    process.stdin.close()
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


STOPPED_BY_CTRL_C = ("api_server", "api-server", "scheduler", "dag-processor")


def live_parts(pgid: int, names: tuple[str, ...]) -> list[str]:
    """The processes of the group, not zombies, whose command line names one of ``names``."""
    ps = subprocess.run(
        ["ps", "-o", "stat=,args=", "-g", str(pgid)], capture_output=True, text=True, check=False
    ).stdout
    return [
        line
        for line in ps.splitlines()
        if not line.strip().startswith("Z") and any(n in line for n in names)
    ]


def run_state(client: httpx.Client, run_id: str) -> str | None:
    state = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json()["state"]
    return str(state) if state in ("success", "failed") else None


def trigger(client: httpx.Client, conf: dict[str, Any], tries: int = 4) -> httpx.Response:
    """A DAG run through the REST API. ``airflow standalone`` keeps Airflow's metadata in
    SQLite, one writer at a time: on a loaded machine a write that waits past SQLite's busy
    timeout fails, rolled back, and the API answers Airflow's generic 500 "Database error"
    (seen once with the suite and other tests sharing the two cores). That answer is asked
    again, a few seconds later; any other is returned as it is."""
    url, body = f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf}
    response = client.post(url, json=body)
    for _ in range(tries - 1):
        if response.status_code != 500 or "Database error" not in response.text:
            break
        time.sleep(3)
        response = client.post(url, json=body)
    return response


def task_states(client: httpx.Client, run_id: str) -> dict[str, Any]:
    tis = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()[
        "task_instances"
    ]
    return {f"{t['task_id']}[{t['map_index']}]": t["state"] for t in tis}


def sign_in(page: Page, base: str, next_path: str, password: str) -> None:
    """Open ``next_path``, which sends to the login form, and sign in as ``admin`` as a user
    would."""
    page.goto(f"{base}{next_path}")
    wait_for_js(page, "the login form", "!!document.querySelector('input[name=password]')")
    page.type_into("input[name=username]", "admin")
    page.type_into("input[name=password]", password)
    wait_for_js(
        page,
        "the Sign in button to enable",
        "!document.querySelector('button[type=submit]').disabled",
    )
    page.click("button[type=submit]")


def trigger_in_form(page: Page, base: str, password: str, table: str) -> None:
    """Sign in, open the DAG's trigger dialog, choose ``table`` only and click Trigger."""
    sign_in(page, base, f"/dags/{DAG_ID}", password)
    button = '[data-testid="trigger-dag-button"]'
    wait_for_js(
        page, "the DAG page's trigger button", f"!!document.querySelector({json.dumps(button)})"
    )
    page.click(button)
    tables = "#element_tables input[role=combobox]"  # the multi-select of the `tables` param
    wait_for_js(
        page, "the trigger form's Tables field", f"!!document.querySelector({json.dumps(tables)})"
    )
    page.type_into(tables, table)
    page.press("Enter", "Enter", 13)  # picks the option the typing left highlighted
    chosen = wait_for_js(
        page, "the chosen table", "document.querySelector('input[name=element_tables]').value"
    )
    assert chosen == table, chosen
    page.click_element(
        "[...document.querySelectorAll('[role=dialog] button')]"
        ".find(b => b.innerText.trim() === 'Trigger')",
        "the dialog's Trigger button",
    )
    wait_for_js(page, "the new run's page", "location.pathname.includes('/runs/')")


def error_lines(log_dir: Path, task: str) -> list[str]:
    """The error-level lines of every log file of ``task`` (Airflow writes JSON lines)."""
    files = [p for p in log_dir.rglob("*.log") if f"task_id={task}" in str(p)]
    assert files, f"no log of task {task} under {log_dir}"
    return [
        line
        for p in files
        for line in p.read_text(errors="replace").splitlines()
        if '"level":"error"' in line.replace(" ", "") or "ERROR" in line
    ]


def test_readme_commands_work_as_written(
    checkout: Path, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    reason = engine_missing()
    if reason:
        pytest.skip(reason)
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (Debian package chromium; .ci/setup installs it)")
    blocks = readme_blocks()
    port = free_port()
    env = fresh_env(tmp_path / "home", port)
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "shell1.log"
    started = time.monotonic()
    with shell_one(blocks["shell 1"], checkout, env, log) as shell:

        def healthy() -> bool | None:
            if shell.poll() is not None:
                raise AssertionError(
                    f"shell 1 exited with {shell.returncode}:\n{log.read_text()[-4000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                return (
                    True
                    if httpx.get(f"{base}/api/v2/monitor/health", timeout=5).status_code == 200
                    else None
                )
            return None

        wait_for("airflow standalone's api-server", healthy, timeout=240, interval=2)

        two = subprocess.run(
            ["bash", "-e", "-c", blocks["shell 2"]],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
        found = re.search(r'\{[^{}]*"admin"[^{}]*\}', two.stdout)
        assert found, f"shell 2 printed no login: {two.stdout[-2000:]}"
        password = json.loads(found.group(0))["admin"]

        def login() -> str | None:
            response = httpx.post(
                f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=60
            )
            assert response.status_code in (200, 201), response.text
            return str(response.json()["access_token"])

        token = wait_for("a login with the README's password", login, timeout=300, interval=2)
        with httpx.Client(
            base_url=base,
            timeout=120,
            headers={"Authorization": f"Bearer {token}"},
            transport=httpx.HTTPTransport(retries=3),
        ) as client:
            runs = client.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
            assert [r["conf"] for r in runs] == [{"tables": [TABLE]}], runs
            run_id = runs[0]["dag_run_id"]
            state = wait_for(
                f"DAG run {run_id}", lambda: run_state(client, run_id), timeout=600, interval=3
            )
            assert state == "success", task_states(client, run_id)
            ran = time.monotonic() - started
            lake = tmp_path / "lake"
            assert published_rows(lake, TABLE) == source_rows(mariadb, TABLE)
            assert manifest(lake, OTHER) is None
            first = manifest(lake, TABLE)
            assert first is not None

            # The UI: changes in the source, then a run of TABLE alone from the trigger form.
            mariadb.execute(
                f"UPDATE {TABLE} SET qty = qty + 100 WHERE id <= 5",
                f"DELETE FROM {TABLE} WHERE id = 7",
                f"INSERT INTO {TABLE} VALUES (301, 'order-301', NULL)",
                f"INSERT INTO {OTHER} VALUES (3, 'item-3', 3)",
            )
            ui_started = time.monotonic()
            before = {
                r["dag_run_id"]
                for r in client.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
            }
            with chromium_page(chromium) as page:
                try:
                    trigger_in_form(page, base, password, TABLE)
                finally:
                    page.screenshot(tmp_path / "trigger-form.png")
            new = [
                r
                for r in client.get(f"/api/v2/dags/{DAG_ID}/dagRuns").json()["dag_runs"]
                if r["dag_run_id"] not in before
            ]
            assert len(new) == 1, new
            ui_id = new[0]["dag_run_id"]
            assert new[0]["triggered_by"] == "ui", new[0]
            assert new[0]["conf"] == {"tables": [TABLE], "snapshot": False, "chunk_size": None}, (
                new[0]
            )

            bad = trigger(client, {"tabels": [TABLE]})
            assert bad.status_code == 200, bad.text  # Airflow accepts any key; the run refuses it
            bad_id = bad.json()["dag_run_id"]
            state = wait_for(
                f"the UI's run {ui_id}", lambda: run_state(client, ui_id), timeout=600, interval=3
            )
            assert state == "success", task_states(client, ui_id)
            ui_ran = time.monotonic() - ui_started
            assert published_rows(lake, TABLE) == source_rows(mariadb, TABLE)
            caught_up = manifest(lake, TABLE)
            assert caught_up is not None and caught_up["version"] == first["version"] + 1, caught_up
            assert caught_up["rows"] == 300, caught_up
            assert manifest(lake, OTHER) is None
            events = client.get(f"/api/v2/assets/events?source_dag_id={DAG_ID}").json()[
                "asset_events"
            ]
            extras = {e["uri"]: e["extra"] for e in events if e["source_run_id"] == ui_id}
            assert extras[f"file://{lake}/shop/orders"]["published"] is True, events
            assert extras[f"file://{lake}/shop/items"]["published"] is False, events
            assert (
                wait_for("the misspelt run", lambda: run_state(client, bad_id), timeout=300)
                == "failed"
            )
            states = task_states(client, bad_id)
            assert states["plan[-1]"] == "failed" and states["read[-1]"] == "upstream_failed", (
                states
            )

        logs = checkout / ".airflow" / "logs"
        for task in ("read", "reconcile"):
            assert error_lines(logs / f"dag_id={DAG_ID}" / f"run_id={run_id}", task) == []
        plan = "".join(
            p.read_text(errors="replace")
            for p in (logs / f"dag_id={DAG_ID}" / f"run_id={bad_id}").rglob("*.log")
            if "task_id=plan" in str(p)
        )
        assert "run conf: unknown key 'tabels'; valid keys: tables, snapshot, chunk_size" in plan

        os.killpg(shell.pid, signal.SIGINT)  # Ctrl+C in shell 1
        # Airflow 3.3.2: the triggerer can survive Ctrl+C and keep standalone waiting for it
        # (README says so); every other part must stop. The `finally` kills what is left.
        wait_for(
            "the api-server, scheduler and dag-processor to stop after Ctrl+C",
            lambda: True if not live_parts(shell.pid, STOPPED_BY_CTRL_C) else None,
            timeout=120,
            interval=1,
        )
    print(
        f"README Airflow walk-through: DAG run of {TABLE} done {ran:.0f}s after shell 1 started; "
        f"the UI form's catch-up run {ui_ran:.0f}s from opening the browser"
    )
