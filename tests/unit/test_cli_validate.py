"""`tidemark validate`: exit 0 on a good config, 2 naming the key on a bad one, never a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.app.cli import main

TIDEMARK = Path(sys.executable).parent / "tidemark"

GOOD: dict[str, Any] = {
    "pipeline": "shop",
    "source": {
        "host": "127.0.0.1",
        "user": "snap",
        "password": "hunter2-not-printed",
        "server_id": 54001,
    },
    "output": {"path": "/tmp/lake"},
    "state": {"url": "sqlite:////tmp/state.db"},
    "tables": [{"name": "shop.orders"}, {"name": "shop.customers", "chunk_size": 10}],
}


def write(tmp_path: Path, data: Any, name: str = "shop.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def bad_config() -> dict[str, Any]:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["defaults"] = {"chunk_size": 0}
    data["source"]["prot"] = 3306
    return data


def test_main_accepts_a_good_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD)
    assert main(["validate", "--config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "ok" in out and "shop.orders, shop.customers" in out and "pipeline shop" in out
    assert "hunter2" not in out + err


def test_main_rejects_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, bad_config())
    assert main(["validate", "--config", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert any("defaults.chunk_size" in line for line in lines), err
    assert any("source.prot: unknown key" in line for line in lines), err
    assert all(line.startswith("tidemark: error: ") and str(path) in line for line in lines), err
    assert "Traceback" not in out + err and "hunter2" not in out + err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["validate"], "--config"),
        (["validate", "--config", "/nonexistent/shop.yaml"], "cannot read config file"),
        (["frobnicate", "--config", "x.yaml"], "invalid choice"),
    ],
)
def test_main_bad_arguments_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert expected in err and "Traceback" not in out + err


def run_tidemark(*args: str) -> subprocess.CompletedProcess[str]:
    if not TIDEMARK.exists():
        pytest.skip(f"{TIDEMARK} is not installed (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TM_TEST_")}
    return subprocess.run(
        [str(TIDEMARK), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_console_script_good_and_bad(tmp_path: Path) -> None:
    good = run_tidemark("validate", "--config", str(write(tmp_path, GOOD)))
    assert good.returncode == 0, good.stderr
    assert "pipeline shop" in good.stdout

    bad = run_tidemark("validate", "--config", str(write(tmp_path, bad_config(), "bad.yaml")))
    assert bad.returncode == 2
    assert "defaults.chunk_size" in bad.stderr and "source.prot" in bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
    assert "hunter2" not in bad.stdout + bad.stderr


def test_console_script_unset_password_env(tmp_path: Path) -> None:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    del data["source"]["password"]
    data["source"]["password_env"] = "TM_TEST_NEVER_SET"
    result = run_tidemark("validate", "--config", str(write(tmp_path, data)))
    assert result.returncode == 2
    assert "source.password_env" in result.stderr and "TM_TEST_NEVER_SET" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("pipeline: shop\ntables: [\n")
    result = run_tidemark("validate", "--config", str(path))
    assert result.returncode == 2
    assert "not valid YAML" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("size", ["0", "-5", "lots", str(10**30)])
def test_run_refuses_a_bad_chunk_size_before_starting(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 from the argument parser: no config read, no Spark started, no source contacted."""
    assert main(["run", "--config", "/nonexistent/shop.yaml", "--chunk-size", size]) == 2
    err = capsys.readouterr().err
    assert (
        "--chunk-size: expected a number of rows from 1 to 2147483647" in err
        and "cannot read config" not in err
    )
