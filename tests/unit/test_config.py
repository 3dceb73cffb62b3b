"""Pipeline config validation: each bad config is a ConfigError naming the file and key path."""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.config import (
    Defaults,
    OutputConfig,
    PipelineConfig,
    Secret,
    SourceConfig,
    SparkConfig,
    TlsConfig,
    load_config,
    parse_config,
)
from orchestrator.errors import ConfigError

DELETE = object()

GOOD: dict[str, Any] = {
    "pipeline": "shop",
    "source": {
        "host": "db.internal",
        "port": 3307,
        "user": "snap",
        "password_env": "TM_TEST_PASSWORD",
        "server_id": 54001,
    },
    "spark": {"master": "local[2]", "conf": {"spark.driver.memory": "1g"}},
    "output": {"path": "/tmp/lake"},
    "state": {"url": "sqlite:////tmp/state.db"},
    "defaults": {"chunk_size": 1000, "batch_chunks": 4},
    "tables": [
        {"name": "shop.orders"},
        {
            "name": "shop.order_items",
            "chunk_key": ["order_id", "line_no"],
            "chunk_size": 200,
            "where": "created_at >= '2020-01-01'",
        },
    ],
}


@pytest.fixture(autouse=True)
def _password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TM_TEST_PASSWORD", "s3cr3t-Pa55word")


def mutated(*changes: tuple[str, Any]) -> dict[str, Any]:
    """GOOD with ``("a.b[1].c", value)`` changes applied; DELETE removes the key."""
    data = copy.deepcopy(GOOD)
    for path, value in changes:
        keys: list[str | int] = []
        for part in path.split("."):
            name, _, index = part.partition("[")
            keys.append(name)
            if index:
                keys.append(int(index.rstrip("]")))
        target: Any = data
        for key in keys[:-1]:
            target = target[key]
        if value is DELETE:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    return data


def problems(data: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, origin="shop.yaml")
    return caught.value.problems


BAD = [
    ("missing source", [("source", DELETE)], "source: missing required key"),
    ("missing tables", [("tables", DELETE)], "tables: missing required key"),
    ("missing source.user", [("source.user", DELETE)], "source.user: missing required key"),
    ("unknown top-level key", [("sources", {})], "sources: unknown key"),
    ("unknown nested key", [("source.hots", "x")], "source.hots: unknown key"),
    ("unknown table key", [("tables[1].chunk_keys", ["id"])], "tables[1].chunk_keys: unknown key"),
    ("unknown defaults key", [("defaults.chunksize", 5)], "defaults.chunksize: unknown key"),
    (
        "chunk_size 0",
        [("defaults.chunk_size", 0)],
        "defaults.chunk_size: must be from 1 to 2147483647 rows",
    ),
    (
        "table chunk_size 0",
        [("tables[1].chunk_size", 0)],
        "tables[1].chunk_size: must be from 1 to",
    ),
    (
        "chunk_size too large",
        [("defaults.chunk_size", 10**30)],
        "defaults.chunk_size: must be from 1 to",
    ),
    ("negative batch_chunks", [("defaults.batch_chunks", -1)], "defaults.batch_chunks"),
    (
        "table name without database",
        [("tables[0].name", "orders")],
        "tables[0].name: expected `database.table`",
    ),
    (
        "table name that cannot be a directory",
        [("tables[0].name", "shop.a/b")],
        "tables[0].name: table `shop.a/b`: `a/b` cannot be a directory of the lake",
    ),
    (
        "duplicate table",
        [("tables[1]", {"name": "shop.orders"})],
        "tables[1].name: table shop.orders is listed twice",
    ),
    ("empty tables", [("tables", [])], "tables: expected a non-empty list"),
    (
        "tables not a list",
        [("tables", {"name": "shop.orders"})],
        "tables: expected a non-empty list",
    ),
    ("table not a mapping", [("tables[0]", "shop.orders")], "tables[0]: expected a mapping"),
    (
        "bad chunk_key",
        [("tables[1].chunk_key", [1, 2])],
        "tables[1].chunk_key: expected a column name",
    ),
    ("pipeline with capitals", [("pipeline", "Shop")], "pipeline: must match [a-z0-9_]+"),
    ("pipeline with a dash", [("pipeline", "shop-eu")], "pipeline: must match"),
    ("pipeline not a string", [("pipeline", 7)], "pipeline: expected a string"),
    (
        "port as text",
        [("source.port", "3306x")],
        "source.port: expected an integer, found a string",
    ),
    ("port out of range", [("source.port", 70000)], "source.port: must be a TCP port"),
    ("port as boolean", [("source.port", True)], "source.port: expected an integer, found boolean"),
    ("server_id 0", [("source.server_id", 0)], "source.server_id: must be a positive integer"),
    (
        "chunk_size as text",
        [("defaults.chunk_size", "big")],
        "defaults.chunk_size: expected an integer",
    ),
    (
        "chunk_size as float",
        [("defaults.chunk_size", 10.5)],
        "defaults.chunk_size: expected an integer",
    ),
    ("spark.conf a list", [("spark.conf", ["a"])], "spark.conf: expected a mapping"),
    (
        "spark master and remote",
        [("spark.remote", "sc://spark:15002")],
        "spark: give one of spark.master and spark.remote",
    ),
    (
        "spark.remote not sc://",
        [("spark.master", DELETE), ("spark.remote", "http://spark:15002")],
        "spark.remote: expected a Spark Connect URL like sc://host:15002",
    ),
    ("source a string", [("source", "db.internal")], "source: expected a mapping"),
    ("host an integer", [("source.host", 5)], "source.host: expected a string"),
    ("two password sources", [("source.password", "x")], "source: give only one of password"),
    (
        "password an integer",
        [("source.password_env", DELETE), ("source.password", 1234)],
        "source.password: expected a string",
    ),
    (
        "unset password env",
        [("source.password_env", "TM_TEST_UNSET_VARIABLE")],
        "source.password_env: environment variable TM_TEST_UNSET_VARIABLE is not set",
    ),
    (
        "negative read margin",
        [("defaults.read_margin_seconds", -1)],
        "defaults.read_margin_seconds: must be >= 0",
    ),
    (
        "expected_run_hours 0",
        [("defaults.expected_run_hours", 0)],
        "defaults.expected_run_hours: must be > 0",
    ),
    (
        "bad distribution factor",
        [("defaults.even_distribution_factor", [5, 1])],
        "defaults.even_distribution_factor",
    ),
    (
        "keep_versions text",
        [("output.keep_versions", "all")],
        "output.keep_versions: expected an integer",
    ),
    (
        "integer_encoding unknown",
        [("output.integer_encoding", "zigzag")],
        "output.integer_encoding: expected one of delta, plain, found 'zigzag'",
    ),
    (
        "keyless_lock text",
        [("tables[0].keyless_lock", "yes")],
        "tables[0].keyless_lock: expected a boolean, found a string 'yes'",
    ),
]


@pytest.mark.parametrize(
    ("changes", "expected"), [(c, e) for _, c, e in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_config_names_the_key(changes: list[tuple[str, Any]], expected: str) -> None:
    found = problems(mutated(*changes))
    assert any(expected in p for p in found), found
    assert all(p.startswith("shop.yaml: ") for p in found), found


def test_good_config_is_accepted_as_is() -> None:
    assert isinstance(parse_config(mutated(), origin="shop.yaml"), PipelineConfig)


def test_not_a_mapping_at_all() -> None:
    assert any("expected a mapping, found a list" in p for p in problems(["pipeline: shop"]))


def test_several_errors_are_reported_together() -> None:
    found = problems(
        mutated(
            ("pipeline", "Bad Name"),
            ("source.hots", 1),
            ("defaults.chunk_size", 0),
            ("tables[0].name", "orders"),
            ("state", DELETE),
        )
    )
    for key in ("pipeline:", "source.hots:", "defaults.chunk_size:", "tables[0].name:", "state:"):
        assert any(f"shop.yaml: {key}" in p for p in found), (key, found)
    assert len(found) >= 5


def test_unset_env_is_allowed_when_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TM_TEST_PASSWORD")
    config = parse_config(mutated(), check_env=False)
    with pytest.raises(ConfigError, match="TM_TEST_PASSWORD is not set"):
        config.resolve_password()


def test_good_config_round_trips_with_defaults_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "shop.yaml"
    path.write_text(yaml.safe_dump(GOOD, sort_keys=False))
    config = load_config(path)

    assert config.path == path
    assert config.pipeline == "shop"
    assert (config.source.host, config.source.port, config.source.user) == (
        "db.internal",
        3307,
        "snap",
    )
    assert config.source.time_zone == "+00:00" and config.source.connect_timeout == 10
    assert config.spark.conf == {"spark.driver.memory": "1g"}
    assert config.staging_path == "/tmp/lake/_staging"
    assert config.defaults.fetch_size == 10000  # not in the file: the default
    orders, items = config.tables
    assert (orders.name, orders.chunk_size, orders.batch_chunks, orders.chunk_key) == (
        "shop.orders",
        1000,
        4,
        None,
    )
    assert (items.database, items.table) == ("shop", "order_items")
    assert (items.chunk_size, items.batch_chunks) == (200, 4)
    assert items.chunk_key == ("order_id", "line_no")
    assert items.where == "created_at >= '2020-01-01'"
    assert config.resolve_password() == "s3cr3t-Pa55word"
    assert config.select_tables(["shop.order_items"]) == (items,)
    assert all(t.chunk_size == 7 for t in config.with_chunk_size(7).tables)
    assert load_config(path) == config


def test_spark_remote_instead_of_a_master() -> None:
    config = parse_config(
        mutated(("spark.master", DELETE), ("spark.remote", "sc://spark.internal:15002/;user_id=tm"))
    )
    assert config.spark.remote == "sc://spark.internal:15002/;user_id=tm"


def test_keys_left_out_take_the_dataclass_defaults() -> None:
    minimal = mutated(("source.port", DELETE), ("spark", DELETE), ("defaults", DELETE))
    config = parse_config(minimal)
    assert config.defaults == Defaults()
    assert config.spark == SparkConfig()
    assert config.output == OutputConfig(path="/tmp/lake")
    assert config.source == SourceConfig(
        host="db.internal", user="snap", server_id=54001, password_env="TM_TEST_PASSWORD"
    )


def test_keyless_lock_is_off_unless_asked() -> None:
    assert not parse_config(mutated()).tables[0].keyless_lock
    assert parse_config(mutated(("tables[0].keyless_lock", True))).tables[0].keyless_lock


def test_single_column_chunk_key_may_be_a_string() -> None:
    config = parse_config(mutated(("tables[0].chunk_key", "order_id")))
    assert config.tables[0].chunk_key == ("order_id",)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.table("shop.nope"),
        lambda c: c.select_tables(["shop.orders", "shop.nope"]),
        lambda c: c.with_chunk_size(0),
    ],
)
def test_runtime_lookups_raise_config_error(call: Any) -> None:
    with pytest.raises(ConfigError):
        call(parse_config(mutated()))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: shop\nsource: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML at line \d+"):
        load_config(bad)


def test_secret_never_printed() -> None:
    secret = "s3cr3t-Pa55word"
    config = parse_config(mutated(("source.password_env", DELETE), ("source.password", secret)))
    assert config.source.password == Secret(secret)
    assert config.resolve_password() == secret
    for text in (
        repr(config),
        str(config),
        repr(config.source),
        str(config.source),
        repr(config.source.password),
        f"{config.source.password}",
    ):
        assert secret not in text
    assert "***" in repr(config.source)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("state.url", ["postgresql://snap:s3cr3t-Pa55word@db/state"]),
        ("output.catalog", {"warehouse": {"s3.secret-access-key": "s3cr3t-Pa55word"}}),
        ("spark.remote", "host:15002/;token=s3cr3t-Pa55word"),
    ],
)
def test_a_misplaced_secret_is_named_not_shown(key: str, value: Any) -> None:
    """A value refused for its type or form is not echoed when it may hold a secret: a list or
    mapping where a string was expected, a Spark Connect URL."""
    data = mutated()
    if key == "spark.remote":
        data["spark"] = {"remote": value}
    else:
        data = mutated((key, value))
    found = problems(data)
    assert found and not any("s3cr3t" in line for line in found), found


@pytest.mark.parametrize("key", ["output.path", "output.staging"])
def test_an_output_uri_of_an_unknown_scheme_is_refused(key: str) -> None:
    """`validate` names it (it was refused only when the run first wrote there)."""
    found = problems(mutated((key, "gs://bucket/lake")))
    assert any(f"{key}: unsupported scheme `gs://`" in line for line in found), found


def test_jdbc_url_params_may_not_replace_the_session_tidemark_sets() -> None:
    """A user's ``sessionVariables`` replaced the one that sets the time zone and sql_mode."""
    found = problems(
        mutated(
            (
                "source.jdbc_url_params",
                {"sessionVariables": "wait_timeout=60", "useCompression": "true"},
            )
        )
    )
    assert any(
        "source.jdbc_url_params.sessionVariables: is set by Tidemark" in line for line in found
    ), found
    assert not any("useCompression" in line for line in found), found


@pytest.mark.parametrize(
    ("key", "setting"),
    [("socketTimeout", "source.read_timeout"), ("connectTimeout", "source.connect_timeout")],
)
def test_jdbc_url_params_may_not_replace_the_timeouts_tidemark_derives(
    key: str, setting: str
) -> None:
    """A ``socketTimeout`` there replaced the one `source.read_timeout` sets, for the reads only."""
    found = problems(mutated(("source.jdbc_url_params", {key: "0"})))
    assert any(f"source.jdbc_url_params.{key}: is set from {setting}" in line for line in found), (
        found
    )


@pytest.mark.parametrize(
    ("tls", "params", "expected"),
    [
        ({"mode": "verify-full"}, {}, "source.tls.mode: expected one of disabled, preferred,"),
        ({"mode": "required", "ca": "/ca.pem"}, {}, "source.tls.ca: is used only to verify"),
        ({"mode": "verify_ca", "ca": "/no/such/ca.pem"}, {}, "source.tls.ca: cannot load CA"),
        ({"mode": "verify_ca", "ca": "NOT_PEM"}, {}, "source.tls.ca: cannot load CA"),
        ({"mode": "required"}, {"trustServerCertificate": "true"}, "is set from source.tls.mode"),
        (
            {"mode": "verify_identity", "cert": "CERT"},
            {},
            "source.tls.cert: goes with source.tls.key",
        ),
        ({"mode": "required", "key": "KEY"}, {}, "source.tls.key: goes with source.tls.cert"),
        ({"cert": "CERT", "key": "KEY"}, {}, "source.tls.cert: is shown over TLS only"),
        ({"mode": "required", "cert": "CERT", "key": "LOCKED"}, {}, "has a passphrase; give it"),
        ({"mode": "required", "cert": "CERT", "key": "OTHER"}, {}, "cannot load the client cert"),
        ({"mode": "required", "cert": "/no/c.pem", "key": "KEY"}, {}, "cannot load the client"),
        ({"mode": "verify_ca", "bundle": "/b.pem"}, {}, "source.tls.bundle: unknown key"),
    ],
)
def test_source_tls_is_checked_by_validate(
    tmp_path: Path, tls: dict[str, str], params: dict[str, str], expected: str
) -> None:
    """A mode Tidemark does not know, a CA beside a mode that checks no certificate, a CA file
    Python's ``ssl`` does not load, a Connector/J setting that would undo the mode, a client
    certificate without its key (or the other way), beside a mode that may not take TLS, with a
    key under a passphrase (never asked for on the terminal) or another certificate's key."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    cert, key = _a_client(tmp_path, "c")
    files = {"NOT_PEM": str(not_pem), "CERT": cert, "KEY": key}
    files["LOCKED"] = _a_client(tmp_path, "locked", passphrase=b"s3cret")[1]
    files["OTHER"] = _a_client(tmp_path, "other")[1]
    tls = {k: files.get(v, v) for k, v in tls.items()}
    found = problems(mutated(("source.tls", tls), ("source.jdbc_url_params", params)))
    assert len(found) == 1 and expected in found[0], found


def test_source_tls_defaults_to_preferred_and_keeps_a_ca_it_loads(tmp_path: Path) -> None:
    assert parse_config(GOOD).source.tls == TlsConfig("preferred", None)
    ca = _a_ca(tmp_path)
    checked = parse_config(mutated(("source.tls", {"mode": "verify_identity", "ca": ca})))
    assert checked.source.tls == TlsConfig("verify_identity", ca)
    preferred = mutated(("source.jdbc_url_params", {"trustServerCertificate": "false"}))
    assert parse_config(preferred).source.jdbc_url_params == {"trustServerCertificate": "false"}
    cert, key = _a_client(tmp_path, "c")
    shown = parse_config(mutated(("source.tls", {"mode": "required", "cert": cert, "key": key})))
    assert shown.source.tls == TlsConfig("required", None, cert, key)


def _a_client(directory: Path, name: str, passphrase: bytes | None = None) -> tuple[str, str]:
    """A self-signed client certificate and its key (under ``passphrase``, if given), as PEM
    files ``<name>-cert.pem`` and ``<name>-key.pem``."""
    certificate, key = _self_signed(name)
    cert, key_file = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    encryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return str(cert), str(key_file)


def _a_ca(directory: Path) -> str:
    """A self-signed CA certificate as a PEM file."""
    path = directory / "ca.pem"
    path.write_bytes(_self_signed("test CA")[0].public_bytes(serialization.Encoding.PEM))
    return str(path)


def _self_signed(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for ``name``, signed by its own new key, valid for a day; and the key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def test_a_nested_spark_conf_value_is_refused() -> None:
    """It was turned into its Python text (``{'memory': '4g'}``) and handed to Spark."""
    found = problems(
        mutated(("spark.conf", {"spark.executor": {"memory": "4g"}, "spark.ui.enabled": False}))
    )
    assert any("spark.conf.spark.executor: expected a single value" in line for line in found), (
        found
    )
    assert not any("spark.ui.enabled" in line for line in found), found


def test_a_malformed_time_zone_is_refused_by_validate() -> None:
    """It was refused only when a run built its JDBC URL; a zone the server does not know still
    is, at the first connection (exit 3, naming the fix)."""
    found = problems(mutated(("source.time_zone", "UTC'; DROP")))
    assert any("source.time_zone: expected an offset like +00:00" in line for line in found), found
    assert (
        parse_config(mutated(("source.time_zone", "Europe/Berlin"))).source.time_zone
        == "Europe/Berlin"
    )
