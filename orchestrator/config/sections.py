"""The config's sections as frozen dataclasses, and the `Reader` that fills them from YAML.

One dataclass per YAML section; a field's default here is the one place that default is
written (`field_default`). `Reader` walks the parsed YAML and collects every problem with
its file and key path (`orchestrator.config` reads the sections, `orchestrator.config.patterns`
the ``tables`` list). `orchestrator.config` re-exports the dataclasses.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from orchestrator.config.credentials import Secret

DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
IDENTIFIER = re.compile(r"^[A-Za-z0-9_$]+$")
#: URI schemes of ``output.path`` and ``output.staging`` (`orchestrator.lake.storage`); none: a
#: local path.
STORAGE_SCHEMES = ("file", "s3a", "s3", "hdfs")


def storage_uri(value: str) -> str | None:
    """What is wrong with an output URI's scheme, or None.

    >>> storage_uri("/data/lake"), storage_uri("s3a://bucket/lake")
    (None, None)
    >>> storage_uri("gs://bucket/lake")
    'unsupported scheme `gs://`; use a local path or one of file://, s3a://, s3://, hdfs://'
    """
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme and scheme not in STORAGE_SCHEMES:
        known = ", ".join(s + "://" for s in STORAGE_SCHEMES)
        return f"unsupported scheme `{scheme}://`; use a local path or one of {known}"
    return None


def lake_safe(*parts: str) -> bool:
    """Whether database and table names can be directories of the lake (``<output>/<database>/
    <table>``): MySQL and MariaDB take ``..``, ``.`` and names with ``/`` too, which would name
    the lake's root, the database's directory or one inside another table's.

    >>> lake_safe("shop-prod", "order items"), lake_safe(".."), lake_safe("shop", "a/b")
    (True, False, False)
    """
    return all(p not in (".", "..") and not any(c in p for c in "/\\\0") for p in parts)


def table_name_problem(name: str) -> str | None:
    """What is wrong with a table's name as the config gives it, or None: ``database.table``,
    parted at the first dot, each part any name the server takes (``shop-prod.order-items``)
    that `lake_safe` allows.

    >>> table_name_problem("shop-prod.order items"), table_name_problem("shop.orders.v2")
    (None, None)
    >>> table_name_problem("orders")
    "expected `database.table`, found 'orders'"
    >>> print(table_name_problem("shop..."))
    table `shop...`: `..` cannot be a directory of the lake; rename it at the source
    """
    database, dot, table = name.partition(".")
    if not (database and dot and table) or name != name.strip():
        return f"expected `database.table`, found {name!r}"
    unsafe = [p for p in (database, table) if not lake_safe(p)]
    if unsafe:
        return (
            f"table `{name}`: `{unsafe[0]}` cannot be a directory of the lake; rename it at the "
            "source"
        )
    return None


#: ``source.tls.mode``: how every connection to the source takes TLS, named as the MySQL
#: client's ``--ssl-mode`` (`orchestrator.source.tls`, docs/source.md).
TLS_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
#: The modes that check the source's certificate (and take ``source.tls.ca``).
TLS_VERIFYING = ("verify_ca", "verify_identity")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``source.tls``: ``mode`` one of `TLS_MODES`; ``ca`` the PEM file of the CA certificates
    a verifying mode trusts (none: the system's); ``cert`` and ``key`` the PEM files of the
    client certificate shown to the server and of its private key (`orchestrator.config.tls`)."""

    mode: str = "preferred"
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class SourceConfig:
    host: str
    port: int = field(default=3306, kw_only=True)  # keyword-only: a default before required fields
    user: str
    server_id: int
    password: Secret | None = None
    password_env: str | None = None
    airflow_conn_id: str | None = None
    jdbc_driver_jar: str = DEFAULT_JDBC_JAR
    jdbc_url_params: Mapping[str, str] = field(default_factory=dict)
    time_zone: str = "+00:00"
    connect_timeout: int = 10
    read_timeout: int = 600  # seconds any query, JDBC read or binlog packet may take
    tls: TlsConfig = field(default_factory=TlsConfig)


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """``spark``: a master the run starts its own driver on, or ``remote``, a Spark Connect
    server (``sc://host:15002``) every step attaches to (one of the two)."""

    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)
    remote: str | None = None


@dataclass(frozen=True, slots=True)
class CatalogConfig:
    """``output.catalog``: the Iceberg catalog every table is committed to. ``properties`` are
    pyiceberg catalog properties (``type``, ``uri``, ...); none means a SQL catalog in the
    state store's database (`orchestrator.lake.iceberg.catalog_properties`)."""

    name: str = "tidemark"
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class S3Config:
    """``output.s3``: the S3-compatible object store of ``s3://``/``s3a://`` staging and output
    (`orchestrator.config.objectstore`). Credentials come from the AWS default chain, or from the
    environment variables named here; never from the YAML."""

    endpoint: str | None = None  # default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS's
    region: str | None = None  # default: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1
    path_style: bool = False  # path-style addressing (MinIO, Ceph, most on-premises stores)
    access_key_env: str | None = None
    secret_key_env: str | None = None
    session_token_env: str | None = None


@dataclass(frozen=True, slots=True)
class OutputConfig:
    path: str
    staging: str | None = None  # default: <path>/_staging
    keep_versions: int = 5
    keep_hours: float = 24.0  # versions younger than this are kept too (queries still read them)
    #: How the data files Tidemark writes store columns held as 32- or 64-bit integers:
    #: ``delta`` (DELTA_BINARY_PACKED) or ``plain`` (for Iceberg's vectorized Spark reader
    #: before 1.10); docs/output.md, "The Iceberg table".
    integer_encoding: str = "delta"
    catalog: CatalogConfig = field(default_factory=CatalogConfig)
    s3: S3Config = field(default_factory=S3Config)


@dataclass(frozen=True, slots=True)
class AirflowConfig:
    """``airflow``: what the Airflow layer creates for the pipeline (`tidemark airflow-pool`)."""

    pool_slots: int = 2  # source-connecting tasks at once; each can be a Spark driver JVM


@dataclass(frozen=True, slots=True)
class StateConfig:
    url: str
    #: The pipeline lock's lease: a holder renews it from a heartbeat while it lives; another
    #: run takes the lock over only after this long without a renewal (docs/design.md "One writer").
    lock_lease_seconds: int = 900


@dataclass(frozen=True, slots=True)
class Defaults:
    chunk_size: int = 200000
    batch_chunks: int = 16
    fetch_size: int = 10000
    read_margin_seconds: float = 0.5
    even_distribution_factor: tuple[float, float] = (0.05, 2.0)
    expected_run_hours: float = 6.0
    capture_batch_rows: int = 50000
    read_attempts: int = 3


@dataclass(frozen=True, slots=True)
class TableConfig:
    """One entry of ``tables``: a table, or a glob over database and table names (`pattern`)
    whose per-table keys apply to every table it matches (`orchestrator.config.patterns`)."""

    name: str
    chunk_size: int
    batch_chunks: int
    chunk_key: tuple[str, ...] | None = None
    where: str | None = None
    exclude: tuple[str, ...] = ()  # globs a pattern entry leaves out
    #: A table without a key on a server that gives no snapshot position (MySQL) may be held
    #: under ``LOCK TABLES ... READ`` while its read's snapshot starts
    #: (`orchestrator.source.snapshot`).
    keyless_lock: bool = False

    @property
    def pattern(self) -> bool:
        """Whether ``name`` is a glob (``*``, ``?`` or ``[``) rather than one table."""
        return any(c in self.name for c in "*?[")

    @property
    def database(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]


# --------------------------------------------------------------------------- reading


class Reader:
    """Walks a parsed YAML mapping, collecting problems instead of stopping at the first."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.problems: list[str] = []

    def problem(self, key: str, message: str) -> None:
        self.problems.append(f"{self.origin}: {key}: {message}")

    def mapping(self, data: Any, key: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.problem(key, f"expected a mapping, found {kind_name(data)}")
            return {}
        for unknown in sorted(set(data) - allowed, key=str):
            self.problem(
                f"{key}.{unknown}" if key else str(unknown),
                f"unknown key; expected one of {', '.join(sorted(allowed))}",
            )
        for missing in sorted(required - set(data)):
            self.problem(f"{key}.{missing}" if key else missing, "missing required key")
        return data

    def setting(
        self,
        data: Mapping[str, Any],
        path: str,
        section: type[Any],
        kind: type | tuple[type, ...],
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        """`value` at ``path`` (e.g. ``source.time_zone``), defaulting to what the section's
        dataclass (e.g. `SourceConfig`) declares for the field the path ends in."""
        key = path.rpartition(".")[2]
        return self.value(data, key, path, kind, field_default(section, key), check)

    def value(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        kind: type | tuple[type, ...],
        default: Any = None,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            self.problem(path, f"expected {_kind_names(kinds)}, found boolean {value}")
            return default
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            # a list or mapping is named, not shown: it may hold a secret (a URL with its
            # password given as a list, a catalog credential nested one level too deep)
            shown = f" {value!r}" if isinstance(value, str | int | float) else ""
            self.problem(path, f"expected {_kind_names(kinds)}, found {kind_name(value)}{shown}")
            return default
        if check is not None:
            message = check(value)
            if message:
                self.problem(path, message)
                return default
        return value


def field_default(cls: type[Any], name: str) -> Any:
    """The default a config dataclass declares for a field: the one place each default is written.

    >>> field_default(Defaults, "chunk_size"), field_default(SparkConfig, "conf")
    (200000, {})
    """
    for declared in fields(cls):
        if declared.name == name:
            if declared.default_factory is not MISSING:
                return declared.default_factory()
            if declared.default is not MISSING:
                return declared.default
    raise TypeError(f"{cls.__name__}.{name} declares no default")


def section_keys(cls: type[Any]) -> set[str]:
    """The keys a config section takes: its dataclass's fields."""
    return {declared.name for declared in fields(cls)}


def kind_name(value: Any) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        type(None): "nothing",
    }.get(type(value), type(value).__name__)


def _kind_names(kinds: tuple[type, ...]) -> str:
    return " or ".join(
        {
            int: "an integer",
            str: "a string",
            float: "a number",
            bool: "a boolean",
            dict: "a mapping",
            list: "a list",
        }.get(k, k.__name__)
        for k in kinds
    )


def positive(value: Any) -> str | None:
    return None if value > 0 else f"must be a positive integer, found {value}"


#: The largest ``chunk_size`` (config, ``--chunk-size``, the DAG param). Planning writes it into
#: SQL (an index walk's ``LIMIT 1 OFFSET n``, `chunking.mysql.boundary_sql`), where MySQL takes
#: at most 2**64-1: 10**30 failed planning with a syntax error. No read wants a chunk of more
#: rows than a signed 32-bit count (the default is 200,000).
CHUNK_SIZE_MAX = 2**31 - 1


def chunk_rows(value: Any) -> str | None:
    """A ``chunk_size``: from 1 to `CHUNK_SIZE_MAX` rows."""
    return (
        None
        if 0 < value <= CHUNK_SIZE_MAX
        else f"must be from 1 to {CHUNK_SIZE_MAX} rows, found {value}"
    )
