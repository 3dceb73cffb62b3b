"""`orchestrator.app.airflow_support`: the Airflow-free half of the DAG layer (no Airflow import
here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.airflow_support import (
    asset_extra,
    asset_uri,
    config_dir,
    params_schema,
    pool_name,
    run_holder,
    run_request,
    scan_configs,
)
from orchestrator.config import PipelineConfig, parse_config
from orchestrator.errors import ConfigError
from orchestrator.pipeline.publish.step import Published


def make(**overrides: Any) -> PipelineConfig:
    data: dict[str, Any] = {
        "pipeline": "shop",
        "source": {"host": "h", "user": "u", "server_id": 1},
        "output": {"path": "/lake"},
        "state": {"url": "sqlite:////s.db"},
        "tables": [{"name": "shop.orders"}, {"name": "shop.items"}],
    }
    data.update(overrides)
    return parse_config(data)


def test_names() -> None:
    config = make()
    assert pool_name(config) == "tidemark_shop_source"
    assert run_holder("tidemark_shop", "manual__1") == "airflow:tidemark_shop/manual__1"


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, (None, False, None)),
        ({"tables": [], "snapshot": False, "chunk_size": None}, (None, False, None)),
        ({"tables": None, "snapshot": None}, (None, False, None)),
        ({"tables": ["shop.items"], "snapshot": True, "chunk_size": 7}, (["shop.items"], True, 7)),
        ({"chunk_size": 2**31 - 1}, (None, False, 2**31 - 1)),
    ],
)
def test_run_request_reads_params(params: dict[str, Any], expected: tuple[Any, ...]) -> None:
    request = run_request(make(), params)
    assert (request.tables, request.snapshot, request.chunk_size) == expected


@pytest.mark.parametrize(
    "params, message",
    [
        ({"tables": ["shop.nope"]}, "shop.nope not in pipeline `shop`"),
        ({"tables": "shop.items"}, "param tables"),
        ({"snapshot": "yes"}, "param snapshot"),
        ({"chunk_size": 0}, "param chunk_size"),
        ({"chunk_size": True}, "param chunk_size"),
        ({"chunk_size": 10**30}, "param chunk_size: expected an integer from 1 to 2147483647"),
        ({"chunk_size": 2**31}, "param chunk_size"),
    ],
)
def test_run_request_refuses_what_the_schema_refuses(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_request(make(), params)


@pytest.mark.parametrize(
    "conf, message",
    [
        (
            {"tabels": ["shop.items"]},
            "run conf: unknown key 'tabels'; valid keys: tables, snapshot, chunk_size$",
        ),
        ({"bogus": 1, "tables": [], "zz": 2}, "run conf: unknown keys 'bogus', 'zz'; valid keys: "),
    ],
)
def test_run_request_refuses_unknown_conf_keys(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_request(make(), {"tables": [], "snapshot": False, "chunk_size": None, **conf}, conf)


def test_snapshot_param_is_optional_in_the_trigger_form() -> None:
    # Airflow 3's form puts * on a param whose type does not allow null.
    assert "null" in params_schema(make())["snapshot"]["type"]


def test_params_schema_lists_the_tables() -> None:
    schema = params_schema(make())
    assert schema["tables"]["items"]["enum"] == ["shop.orders", "shop.items"]
    assert set(schema) == {"tables", "snapshot", "chunk_size"}


@pytest.mark.parametrize(
    "path, uri",
    [
        ("/lake", "file:///lake/shop/orders"),
        ("file:///lake/x/", "file:///lake/x/shop/orders"),
        ("s3a://bucket/lake", "s3a://bucket/lake/shop/orders"),
    ],
)
def test_asset_uri_is_the_output_directory(path: str, uri: str) -> None:
    assert asset_uri(make(output={"path": path}), "shop.orders") == uri


def test_config_dir_default_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEMARK_CONFIG_DIR", raising=False)
    assert config_dir(tmp_path / "dags" / "x.py") == tmp_path / "configs"
    monkeypatch.setenv("TIDEMARK_CONFIG_DIR", str(tmp_path / "elsewhere"))
    assert config_dir(tmp_path / "dags" / "x.py") == tmp_path / "elsewhere"


def test_relative_paths_are_reported_with_the_other_problems(tmp_path: Path) -> None:
    (tmp_path / "rel.yaml").write_text(
        "pipeline: rel\nsource: {host: h, user: u, server_id: 1}\noutput: {path: lake}\n"
        "state: {url: 'sqlite:///state.db'}\ntables: [{name: no_database_part}]\n"
    )

    problems = scan_configs(tmp_path).problems

    assert [p.split(": ")[1] for p in problems] == ["tables[0].name", "output.path", "state.url"]


def test_asset_extra_says_whether_the_run_published_a_version() -> None:
    position = {"file": "binlog.000002", "pos": 900, "row": 0, "gtid_set": None}
    new = Published("shop.orders", "file:///lake/shop/orders", 3, 10, position)
    kept = Published("shop.orders", "file:///lake/shop/orders", 3, 10, position, changed=False)
    assert asset_extra(new, "r")["published"] is True
    extra = asset_extra(kept, "r")
    assert extra["published"] is False and extra["version"] == 3 and extra["position"] == position
    assert "no change, version 3 kept" in str(kept) and "checked up to binlog.000002:900" in str(
        kept
    )


def test_a_config_that_is_not_utf8_or_too_deep_is_one_problem_not_every_dag(tmp_path: Path) -> None:
    """A review: a Latin-1 comment raised UnicodeDecodeError out of the scan (every pipeline's
    DAG failed to import, no file named), and so did deeply nested YAML (RecursionError)."""
    good = (
        "pipeline: good\nsource: {host: h, user: u, server_id: 1}\noutput: {path: /tmp/lake}\n"
        "state: {url: 'sqlite:////tmp/state.db'}\ntables: [{name: shop.orders}]\n"
    )
    (tmp_path / "good.yaml").write_text(good)
    (tmp_path / "latin1.yaml").write_bytes(
        b"# r\xe9plica\n" + good.replace("good", "latin").encode()
    )
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")

    scan = scan_configs(tmp_path)

    assert [c.pipeline for c in scan.configs] == ["good"]
    assert any("latin1.yaml: not UTF-8 text: byte 0xe9 at line 1" in p for p in scan.problems), (
        scan.problems
    )
    assert any("deep.yaml" in p for p in scan.problems), scan.problems
