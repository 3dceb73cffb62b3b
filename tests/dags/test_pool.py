"""``tidemark airflow-pool``: the pipeline's Airflow pool gets ``airflow.pool_slots`` slots.

Against a real (throwaway) Airflow metadata DB: the verb runs Airflow's own
``airflow pools set``, and ``airflow pools get`` must then show the pool with the
configured slots, created the first time and updated after the YAML changed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app.cli import main
from tests.dags.airflow_home import VENV_BIN


def _config(tmp_path: Path, slots: int | None) -> Path:
    data: dict[str, Any] = {
        "pipeline": "pooltest",
        "source": {"host": "h", "user": "u", "password": "x", "server_id": 5},
        "output": {"path": str(tmp_path / "lake")},
        "state": {"url": "sqlite://"},
        "tables": [{"name": "db.t"}],
    }
    if slots is not None:
        data["airflow"] = {"pool_slots": slots}
    path = tmp_path / "pooltest.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _slots(name: str) -> int:
    result = subprocess.run(
        [str(VENV_BIN / "airflow"), "pools", "get", name, "-o", "json"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return int(json.loads(result.stdout)[0]["slots"])


def test_airflow_pool_creates_then_updates_the_pool(
    airflow_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["airflow-pool", "--config", str(_config(tmp_path, None))]) == 0
    assert _slots("tidemark_pooltest_source") == 2  # the default
    assert "pool tidemark_pooltest_source: 2 slot(s)" in capsys.readouterr().out
    assert main(["airflow-pool", "--config", str(_config(tmp_path, 5))]) == 0
    assert _slots("tidemark_pooltest_source") == 5


def test_bad_pool_slots_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--config", str(_config(tmp_path, 0))]) == 2
    assert "airflow.pool_slots" in capsys.readouterr().err
