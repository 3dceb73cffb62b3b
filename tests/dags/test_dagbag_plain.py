"""The dags folder as a user's own CI loads it: a plain ``DagBag``, the dags folder not on
``sys.path``.

Airflow's dag-processor puts the dags folder on ``sys.path`` (``BundleDagBag``,
test_parsing.py); the usual CI check does not::

    from airflow.models.dagbag import DagBag
    bag = DagBag(dag_folder="dags", include_examples=False)
    assert not bag.import_errors

The DAG files import only the installed ``orchestrator`` package (the factory is
``orchestrator.app.airflow_dags``), so they load either way. Airflow 3.3
moved ``DagBag`` to ``airflow.dag_processing.dagbag`` (``airflow.models.dagbag``
still re-exports it, with a FutureWarning) and dropped ``include_examples``: it
is passed where the installed Airflow still takes it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dags.sources import REPO

DAGS = REPO / "dags"
CONFIGS = REPO / "configs"
SPELLINGS = ["airflow.dag_processing.dagbag", "airflow.models", "airflow.models.dagbag"]


def shipped_dag_ids() -> set[str]:
    """``tidemark_<pipeline>`` of every example config in configs/."""
    ids = {f"tidemark_{yaml.safe_load(p.read_text())['pipeline']}" for p in CONFIGS.glob("*.y*ml")}
    assert "tidemark_shop" in ids
    return ids


def on_path(folder: Path) -> bool:
    return any(Path(entry or ".").resolve() == folder for entry in sys.path)


def plain_dagbag(module: str) -> Any:
    """``DagBag(dag_folder=dags)`` as imported from ``module``, with ``include_examples=False`` if
    taken."""
    dagbag_class = importlib.import_module(module).DagBag
    kwargs: dict[str, Any] = {"dag_folder": DAGS}
    if "include_examples" in inspect.signature(dagbag_class).parameters:
        kwargs["include_examples"] = False
    return dagbag_class(**kwargs)


@pytest.mark.filterwarnings("ignore:Importing DagBag from airflow.models.dagbag is deprecated")
@pytest.mark.parametrize("module", SPELLINGS)
def test_a_plain_dagbag_loads_the_example_config(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEMARK_CONFIG_DIR", str(CONFIGS))
    # A BundleDagBag earlier in this process leaves the dags folder on sys.path for good.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != DAGS])

    bag = plain_dagbag(module)

    assert bag.import_errors == {}
    assert set(bag.dag_ids) == shipped_dag_ids()
    assert not on_path(DAGS), "a plain DagBag must not need the dags folder on sys.path"


CI_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    dags = Path(sys.argv[1])
    assert not any(Path(p or ".").resolve() in (dags, dags.parent) for p in sys.path), sys.path
    bag = DagBag(dag_folder=dags)
    assert bag.import_errors == {}, bag.import_errors
    print("dag_ids:", *sorted(bag.dag_ids))  # Airflow logs to stdout too
""")


@pytest.mark.slow
def test_a_fresh_interpreter_outside_the_repo_loads_the_dags(tmp_path: Path) -> None:
    """``python -I`` from another folder: neither the repo nor dags/ is on sys.path, only the
    installed package."""
    env = {**os.environ, "TIDEMARK_CONFIG_DIR": str(CONFIGS)}
    result = subprocess.run(
        [sys.executable, "-I", "-c", CI_SCRIPT, str(DAGS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("dag_ids:")]
    assert set(line.split()[1:]) == shipped_dag_ids()
