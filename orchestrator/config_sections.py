"""The config's sections as frozen dataclasses (`orchestrator.config` reads the YAML into them).

One dataclass per YAML section; a field's default here is the one place that default is
written (`orchestrator.config.field_default`). `orchestrator.config` re-exports them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.credentials import Secret

DEFAULT_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"


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


@dataclass(frozen=True, slots=True)
class SparkConfig:
    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CatalogConfig:
    """``output.catalog``: the Iceberg catalog every table is committed to. ``properties`` are
    pyiceberg catalog properties (``type``, ``uri``, ...); none means a SQL catalog in the
    state store's database (`orchestrator.lake.iceberg.catalog_properties`)."""

    name: str = "tidemark"
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutputConfig:
    path: str
    staging: str | None = None  # default: <path>/_staging
    keep_versions: int = 5
    keep_hours: float = 24.0  # versions younger than this are kept too (queries still read them)
    catalog: CatalogConfig = field(default_factory=CatalogConfig)


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
    chunk_size: int = 50000
    batch_chunks: int = 16
    fetch_size: int = 10000
    read_margin_seconds: float = 0.5
    even_distribution_factor: tuple[float, float] = (0.05, 2.0)
    expected_run_hours: float = 6.0
    capture_batch_rows: int = 50000
    read_attempts: int = 3


@dataclass(frozen=True, slots=True)
class TableConfig:
    name: str
    chunk_size: int
    batch_chunks: int
    chunk_key: tuple[str, ...] | None = None
    where: str | None = None

    @property
    def database(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table(self) -> str:
        return self.name.split(".", 1)[1]
