"""A private Airflow for the DAG tests: temp AIRFLOW_HOME, SQLite metadata DB, this repo's dags/.

Airflow reads its configuration once, when it is first imported, and
``--doctest-modules`` imports ``orchestrator.app.airflow_dags`` (hence
Airflow) while collecting. So ``tests/conftest.py`` sets the environment in
``pytest_configure``, before collection; this fixture only migrates the
metadata DB of that home, once, and every test imports Airflow inside its body.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dags.airflow_home import SESSION_HOME, VENV_BIN


@pytest.fixture(scope="session")
def airflow_home(pytestconfig: pytest.Config) -> Path:
    """The initialised Airflow home (``airflow db migrate`` run once) for the in-process tests."""
    home = pytestconfig.stash.get(SESSION_HOME, None)
    if home is None or os.environ.get("AIRFLOW_HOME") != str(home):
        pytest.fail(
            "the Airflow home of tests/conftest.py is not set (was airflow imported "
            "before pytest_configure, or AIRFLOW_HOME changed since?)"
        )
    if "airflow" in sys.modules:
        from airflow import configuration

        if Path(configuration.AIRFLOW_HOME) != home:
            pytest.fail(
                f"airflow was imported with AIRFLOW_HOME={configuration.AIRFLOW_HOME}, "
                f"not the test home {home}; run tests/dags in a separate pytest process"
            )
    result = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return home
