"""``output.s3``: what `validate` refuses, and one set of settings reaching pyarrow, pyiceberg's
FileIO and Spark's ``fs.s3a.*`` alike (orchestrator/config/objectstore.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import load_config, parse_config
from orchestrator.config.objectstore import (
    credentials,
    iceberg_properties,
    pyarrow_options,
    settings_for,
    spark_conf,
)
from orchestrator.errors import ConfigError
from orchestrator.lake.iceberg import catalog_properties
from orchestrator.pipeline.context import session_settings
from orchestrator.services import jars
from tests.conftest import write_config

SECRET = "very-secret-key-value"

GOOD: dict[str, Any] = {
    "pipeline": "objstore",
    "source": {"host": "db", "user": "snap", "server_id": 5},
    "output": {
        "path": "s3://objstore-lake/lake",
        "staging": "s3a://objstore-stage/staging",
        "s3": {
            "endpoint": "http://127.0.0.1:9000",
            "region": "eu-west-3",
            "path_style": True,
            "access_key_env": "TM_S3_KEY",
            "secret_key_env": "TM_S3_SECRET",
        },
    },
    "state": {"url": "sqlite:////tmp/objstore-state.db"},
    "tables": [{"name": "shop.orders"}],
}


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TM_S3_KEY", "AKIAEXAMPLE")
    monkeypatch.setenv("TM_S3_SECRET", SECRET)


def problems(data: dict[str, Any], check_env: bool = True) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data, origin="p.yaml", check_env=check_env)
    text = str(err.value)
    assert SECRET not in text and "AKIA-literal" not in text
    return text


def with_output(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    data["output"].update(changes)
    return data


@pytest.mark.parametrize("key", ["secret_key", "access_key", "aws_secret_access_key"])
def test_a_literal_key_in_output_s3_is_refused_without_showing_it(key: str) -> None:
    data = with_output()
    data["output"]["s3"][key] = "AKIA-literal"
    text = problems(data)
    assert f"output.s3.{key}: a literal credential is refused" in text
    assert "secret_key_env" in text


def test_literal_keys_in_spark_conf_and_the_catalog_are_refused() -> None:
    data = with_output(catalog={"s3.secret-access-key": "AKIA-literal"})
    data["spark"] = {"conf": {"spark.hadoop.fs.s3a.secret.key": "AKIA-literal"}}
    text = problems(data)
    assert "spark.conf.spark.hadoop.fs.s3a.secret.key: a literal credential" in text
    assert "output.catalog.s3.secret-access-key: a literal credential" in text


def test_s3_settings_need_an_object_store_path() -> None:
    text = problems(with_output(path="/var/lake", staging=None))
    assert "output.s3: is given but neither output.path nor output.staging" in text


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9000", "ftp://host", "http://h/x/y"])
def test_an_endpoint_is_an_http_url(endpoint: str) -> None:
    data = with_output()
    data["output"]["s3"]["endpoint"] = endpoint
    assert "output.s3.endpoint: expected http://host[:port]" in problems(data)


def test_named_variables_must_be_set_and_come_in_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TM_S3_SECRET")
    assert "output.s3.secret_key_env: environment variable TM_S3_SECRET is not set" in problems(
        with_output()
    )
    data = with_output()
    del data["output"]["s3"]["secret_key_env"]
    assert "give both access_key_env and secret_key_env" in problems(data, check_env=False)


def test_one_set_of_settings_reaches_every_client(tmp_path: Path) -> None:
    """The same endpoint, region, addressing and keys for pyarrow (through the buckets the
    config names), pyiceberg's FileIO (the catalog's properties) and Spark (``fs.s3a.*``)."""
    config = load_config(write_config(tmp_path / "p.yaml", GOOD))
    for uri in ("s3://objstore-lake/x", "s3a://objstore-stage/y"):
        assert settings_for(uri) == config.output.s3
    arrow = pyarrow_options(settings_for("s3://objstore-lake/x"), credentials(config.output.s3))
    assert arrow == {
        "region": "eu-west-3",
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
        "access_key": "AKIAEXAMPLE",
        "secret_key": SECRET,
        "allow_delayed_open": True,  # a small file is one PUT, not a multipart upload
    }
    iceberg = catalog_properties(config)
    assert {k: v for k, v in iceberg.items() if k.startswith("s3.")} == {
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.region": "eu-west-3",
        "s3.force-virtual-addressing": "false",
        "s3.access-key-id": "AKIAEXAMPLE",
        "s3.secret-access-key": SECRET,
    }
    conf = session_settings(config).conf
    h = "spark.hadoop.fs.s3a."
    assert (conf[f"{h}endpoint"], conf[f"{h}endpoint.region"]) == (
        "http://127.0.0.1:9000",
        "eu-west-3",
    )
    assert (conf[f"{h}path.style.access"], conf[f"{h}connection.ssl.enabled"]) == ("true", "false")
    assert (conf[f"{h}access.key"], conf[f"{h}secret.key"]) == ("AKIAEXAMPLE", SECRET)
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"


def test_without_named_variables_every_client_uses_the_aws_chain(tmp_path: Path) -> None:
    data = with_output()
    data["output"]["s3"] = {"region": "us-west-2"}
    config = load_config(write_config(tmp_path / "p.yaml", data))
    assert credentials(config.output.s3) is None
    assert pyarrow_options(config.output.s3, None) == {
        "region": "us-west-2",
        "allow_delayed_open": True,
    }
    assert "s3.access-key-id" not in iceberg_properties(config.output.s3, None)
    conf = spark_conf(config.output.s3, None)
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "DefaultCredentialsProvider"
    )
    assert not any(k.endswith(("access.key", "secret.key")) for k in conf)


def test_a_session_for_s3_puts_the_pinned_s3a_jars_on_both_class_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", GOOD))
    settings = session_settings(config)
    assert settings.class_path == jars.jar_paths(jars.S3A)
    assert all(Path(p).is_file() for p in settings.class_path)
    local = load_config(
        write_config(tmp_path / "l.yaml", with_output(path="/lake", staging=None, s3=None))
    )
    assert session_settings(local).class_path == ()
    monkeypatch.setenv(jars.REPO_ENV, str(tmp_path / "empty-repo"))
    with pytest.raises(ConfigError, match=r"org\.apache\.hadoop:hadoop-aws:3\.5\.0 is not in"):
        session_settings(config)


def test_an_endpoint_and_region_left_out_come_from_the_aws_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the AWS SDKs read them: the issue's user exported ``AWS_ENDPOINT_URL``, which pyarrow
    ignored, and every table failed at publish."""
    data = with_output()
    data["output"]["s3"] = {"path_style": True}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    config = load_config(write_config(tmp_path / "p.yaml", data))
    assert pyarrow_options(config.output.s3, None) == {
        "region": "ap-south-1",
        "allow_delayed_open": True,
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
    }
    props = iceberg_properties(config.output.s3, None)
    assert (props["s3.endpoint"], props["s3.region"]) == ("http://127.0.0.1:9000", "ap-south-1")
    conf = spark_conf(config.output.s3, None)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "ap-south-1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.internal:443")
    monkeypatch.delenv("AWS_REGION")
    assert pyarrow_options(config.output.s3, None)["endpoint_override"] == "s3.internal:443"
    assert pyarrow_options(config.output.s3, None)["region"] == "us-east-1"
