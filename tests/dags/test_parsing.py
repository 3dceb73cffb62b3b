"""Parsing the dags folder the way Airflow's dag-processor does: good configs, broken configs.

Airflow attributes an import error to a whole file and hides every DAG of that
file, so a broken config must show up as the import error of
``tidemark_config_errors.py`` (naming the YAML file and the key) while
``tidemark_dags.py`` keeps loading the good pipelines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dags.sources import REPO

pytestmark = pytest.mark.usefixtures("airflow_home")

DAGS = REPO / "dags"


def config(name: str, tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pipeline": name,
        "source": {
            "host": "127.0.0.1",
            "user": "snap",
            "server_id": 54001,
            "password_env": "TIDEMARK_TEST_UNSET_PASSWORD",
        },
        "output": {"path": str(tmp_path / "lake")},
        "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "tables": [{"name": "shop.orders"}, {"name": "shop.customers", "chunk_size": 500}],
    }
    data.update(overrides)
    return data


def write(folder: Path, filename: str, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def parse(monkeypatch: pytest.MonkeyPatch, folder: Path | None) -> Any:
    """A DagBag of the dags folder as the dag-processor builds it (bundle path on sys.path)."""
    from airflow.dag_processing.dagbag import BundleDagBag

    if folder is None:
        monkeypatch.delenv("TIDEMARK_CONFIG_DIR", raising=False)
    else:
        monkeypatch.setenv("TIDEMARK_CONFIG_DIR", str(folder))
    return BundleDagBag(dag_folder=DAGS, bundle_path=DAGS, bundle_name="dags-folder")


def test_good_configs_load_without_import_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "configs"
    write(folder, "alpha.yaml", config("alpha", tmp_path))
    write(folder, "beta.yml", config("beta", tmp_path, schedule="@daily"))
    write(folder, "notes.txt", "not a config")

    bag = parse(monkeypatch, folder)

    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["tidemark_alpha", "tidemark_beta"]
    parsed = {Path(f).name for f in bag.file_last_changed}
    assert parsed == {"tidemark_dags.py", "tidemark_config_errors.py"}, (
        "the helper module is not a DAG file"
    )


def test_the_shipped_configs_folder_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = parse(monkeypatch, None)

    assert bag.import_errors == {}
    expected = {
        f"tidemark_{yaml.safe_load(p.read_text())['pipeline']}"
        for p in (REPO / "configs").glob("*.y*ml")
    }
    assert expected and set(bag.dag_ids) == expected


def test_a_broken_config_is_an_import_error_naming_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "configs"
    write(folder, "good.yaml", config("good", tmp_path))
    bad = config("bad", tmp_path)
    bad["tables"][1]["chunk_size"] = 0
    write(folder, "bad.yaml", bad)
    write(folder, "cron.yaml", config("cron", tmp_path, schedule="61 * * * *"))
    write(folder, "syntax.yaml", "pipeline: [unclosed\n")
    write(folder, "twin.yaml", config("good", tmp_path))

    bag = parse(monkeypatch, folder)

    assert bag.dag_ids == ["tidemark_good"]
    assert list(bag.import_errors) == ["tidemark_config_errors.py"]
    error = bag.import_errors["tidemark_config_errors.py"]
    assert (
        f"{folder / 'bad.yaml'}: tables[1].chunk_size: must be from 1 to 2147483647 rows, found 0"
        in error
    )
    assert f"{folder / 'cron.yaml'}: schedule: '61 * * * *'" in error
    assert f"{folder / 'syntax.yaml'}: not valid YAML at line" in error
    assert f"{folder / 'twin.yaml'}: pipeline: `good` is already the pipeline of" in error


def test_relative_paths_are_refused_under_airflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "configs"
    write(
        folder,
        "rel.yaml",
        config("rel", tmp_path, output={"path": "lake"}, state={"url": "sqlite:///state.db"}),
    )

    bag = parse(monkeypatch, folder)

    assert bag.dag_ids == []
    error = bag.import_errors["tidemark_config_errors.py"]
    assert "rel.yaml: output.path: relative path 'lake'" in error
    assert "rel.yaml: state.url: relative SQLite file" in error


def test_a_missing_configs_folder_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bag = parse(monkeypatch, tmp_path / "nowhere")

    assert bag.dag_ids == []
    assert (
        "nowhere: the Tidemark configs folder does not exist"
        in bag.import_errors["tidemark_config_errors.py"]
    )
