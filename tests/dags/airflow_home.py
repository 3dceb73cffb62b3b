"""The settings of a throwaway Airflow used by the tests (in process for tests/dags, as processes
for e2e).

Light on purpose: ``tests/conftest.py`` imports it before collection starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: The Airflow home ``tests/conftest.py`` gives this pytest process (``config.stash``).
SESSION_HOME = pytest.StashKey[Path]()


def airflow_env(home: Path) -> dict[str, str]:
    """Environment for an Airflow living in ``home``: SQLite metadata DB, this repo's dags/, no
    examples."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGBAG_IMPORT_ERROR_TRACEBACKS": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }
