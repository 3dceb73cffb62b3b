"""A private Airflow for the DAG tests: temp AIRFLOW_HOME, SQLite metadata DB, this repo's dags/.

Airflow reads its configuration once, when it is first imported, so the session
fixture sets the environment before anything imports ``airflow`` and every test
imports Airflow inside its body.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dags.airflow_home import VENV_BIN, airflow_env


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An initialised Airflow home (``airflow db migrate`` run once) for the in-process tests."""
    home = tmp_path_factory.mktemp("airflow-home")
    env = airflow_env(home)
    if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME") != env["AIRFLOW_HOME"]:
        pytest.fail("airflow was imported before the tests/dags fixture set AIRFLOW_HOME; "
                    "run tests/dags in a separate pytest process")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    result = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=dict(os.environ),
                            capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
