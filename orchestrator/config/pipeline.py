"""Pipeline config: YAML in, validated frozen dataclasses out.

Every problem found is collected and reported together as one `ConfigError`,
each line naming the file, the key path, what was expected and what was found.
Secrets are held in `Secret`, whose repr never shows the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import lakes, objectstore
from orchestrator.config.credentials import Secret, resolve_password
from orchestrator.config.patterns import is_glob, listed, parse_tables, resolve
from orchestrator.config.sections import (
    DEFAULT_JDBC_JAR,
    IDENTIFIER,
    AirflowConfig,
    CatalogConfig,
    Defaults,
    OutputConfig,
    Reader,
    SourceConfig,
    SparkConfig,
    StateConfig,
    TableConfig,
    chunk_rows,
    field_default,
    kind_name,
    positive,
    section_keys,
    storage_uri,
)
from orchestrator.config.tls import tls_section
from orchestrator.errors import ConfigError

__all__ = [
    "DEFAULT_JDBC_JAR",
    "TIME_ZONE",
    "AirflowConfig",
    "CatalogConfig",
    "ConfigError",
    "Defaults",
    "OutputConfig",
    "PipelineConfig",
    "SourceConfig",
    "SparkConfig",
    "StateConfig",
    "TableConfig",
    "field_default",
    "load_config",
    "parse_config",
]

PIPELINE_NAME = re.compile(r"^[a-z0-9_]+$")
#: The Airflow DAG of pipeline ``p`` is ``tidemark_<p>``
#: (`orchestrator.app.airflow_support.dag_id`).
DAG_ID_PREFIX = "tidemark_"
#: Connector/J settings `orchestrator.pipeline.read.jdbc.jdbc_url` sets, lower-cased.
_SET_BY_TIDEMARK = frozenset({"sessionvariables", "tinyint1isbit", "yearisdatetype"})
#: Connector/J timeouts `jdbc_url` derives from the source's settings (every connection uses those).
_TIMEOUTS = {"sockettimeout": "source.read_timeout", "connecttimeout": "source.connect_timeout"}

#: Further checks of a config's output and state (origin, output, state -> problem lines).
MoreChecks = Callable[[str, "OutputConfig | None", "StateConfig | None"], list[str]]


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    pipeline: str
    source: SourceConfig
    spark: SparkConfig
    output: OutputConfig
    state: StateConfig
    defaults: Defaults
    tables: tuple[TableConfig, ...]
    schedule: str | None = None
    path: Path | None = None
    airflow: AirflowConfig = field(default_factory=AirflowConfig)

    @property
    def has_patterns(self) -> bool:
        """Whether some entry of ``tables`` is a glob: the table set then comes from the source
        (`orchestrator.source.listing.table_set`)."""
        return any(t.pattern for t in self.tables)

    def entry(self, name: str) -> TableConfig | None:
        """How table ``name`` is configured (see `table`); None when no entry takes it."""
        return resolve(self.tables, name) or resolve(self.tables, name, fold=True)

    def table(self, name: str) -> TableConfig:
        """How table ``name`` is configured: its own entry, else the first pattern taking it
        (`orchestrator.config.patterns.resolve`); needs no source."""
        found = self.entry(name)
        if found is None:
            raise ConfigError(
                f"table `{name}` is not in pipeline `{self.pipeline}`; "
                f"entries: {listed([t.name for t in self.tables])}"
            )
        return found

    def table_where(self, name: str) -> str | None:
        """The ``where`` filter of a table (None: none, or no longer configured)."""
        found = self.entry(name)
        return found.where if found else None

    def select_tables(self, names: list[str] | None) -> tuple[TableConfig, ...]:
        """The tables named, each as `table` configures it (all entries when none are named, for
        a config without patterns). A name may be any table an entry takes; a pattern entry
        itself, or all tables of a config with patterns, need the source's list of tables:
        `orchestrator.source.listing.table_set`."""
        if not names:
            if self.has_patterns:
                raise ConfigError(
                    "internal: the tables of a config with patterns come from the source "
                    "(source.listing.table_set)"
                )
            return self.tables
        patterns = [
            n for n in names if is_glob(n) and any(t.pattern and t.name == n for t in self.tables)
        ]
        if patterns:
            raise ConfigError(
                f"internal: pattern(s) {', '.join(patterns)} need the source's list of "
                "tables (source.listing.table_set)"
            )
        found: list[TableConfig] = []
        missing = []
        for name in dict.fromkeys(names):
            try:
                found.append(self.table(name))
            except ConfigError:
                missing.append(name)
        if missing:
            raise ConfigError(
                f"table(s) {', '.join(missing)} not in pipeline `{self.pipeline}`; "
                f"entries: {listed([t.name for t in self.tables])}"
            )
        place = {t.name: i for i, t in enumerate(self.tables)}  # config order, a pattern's by name
        return tuple(sorted(found, key=lambda t: (place.get(t.name, len(place)), t.name)))

    def with_chunk_size(self, chunk_size: int | None) -> PipelineConfig:
        """A copy whose tables all use ``chunk_size`` (a run-time override)."""
        if chunk_size is None:
            return self
        if chunk_size < 1:
            raise ConfigError(f"--chunk-size must be a positive integer, got {chunk_size}")
        tables = tuple(replace(t, chunk_size=chunk_size) for t in self.tables)
        return replace(self, tables=tables)

    @property
    def staging_path(self) -> str:
        return self.output.staging or self.output.path.rstrip("/") + "/_staging"

    def resolve_password(self) -> str:
        """The source password, from the config, an env var or an Airflow connection."""
        return resolve_password(
            self.source.password, self.source.password_env, self.source.airflow_conn_id
        )


# --------------------------------------------------------------------------- loading


def _port(value: int) -> str | None:
    return None if 0 < value < 65536 else f"must be a TCP port 1..65535, found {value}"


#: What a session time zone may look like: an offset (+02:00) or a zone name (Europe/Berlin);
#: the JDBC URL carries it inside quotes (`orchestrator.pipeline.read.jdbc.jdbc_url`).
TIME_ZONE = re.compile(r"[A-Za-z0-9_+:/-]+")


def _time_zone(value: str) -> str | None:
    return (
        None
        if TIME_ZONE.fullmatch(value)
        else (f"expected an offset like +00:00 or a zone name like Europe/Berlin, found {value!r}")
    )


def load_config(
    path: str | os.PathLike[str], *, check_env: bool = True, more: MoreChecks | None = None
) -> PipelineConfig:
    """Read and validate a pipeline YAML file.

    Args:
        path: the YAML file.
        check_env: also check that ``source.password_env`` is set (off at DAG parse time).
        more: further checks of output and state, reported with all others (Airflow's).

    Raises:
        ConfigError: with every problem found, each naming file and key path.
    """
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config file: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{file}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} cannot be "
            "decoded; save the file as UTF-8"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{file}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{file}: nested too deeply to be a Tidemark config") from exc
    return parse_config(data, origin=str(file), path=file, check_env=check_env, more=more)


def parse_config(
    data: Any,
    *,
    origin: str = "<config>",
    path: Path | None = None,
    check_env: bool = True,
    more: MoreChecks | None = None,
) -> PipelineConfig:
    """Validate an already parsed config mapping (see `load_config`)."""
    r = Reader(origin)
    top = r.mapping(
        data,
        "",
        {
            "pipeline",
            "schedule",
            "source",
            "spark",
            "output",
            "state",
            "defaults",
            "tables",
            "airflow",
        },
        {"pipeline", "source", "output", "state", "tables"},
    )
    pipeline = r.value(
        top,
        "pipeline",
        "pipeline",
        str,
        "",
        lambda v: (
            None
            if PIPELINE_NAME.match(v)
            else f"must match [a-z0-9_]+ (it names the DAG tidemark_<pipeline>), found {v!r}"
        ),
    )
    schedule = r.value(top, "schedule", "schedule", str)
    source = _source(r, top.get("source"), check_env) if "source" in top else None
    spark = _spark(r, top.get("spark", {}))
    output = _output(r, top.get("output"), check_env) if "output" in top else None
    state = _state(r, top.get("state")) if "state" in top else None
    defaults = _defaults(r, top.get("defaults", {}))
    tables = parse_tables(r, top.get("tables"), defaults) if "tables" in top else ()
    m = r.mapping(top.get("airflow", {}), "airflow", section_keys(AirflowConfig), set())
    airflow = AirflowConfig(
        pool_slots=r.setting(m, "airflow.pool_slots", AirflowConfig, int, positive)
    )
    r.problems += more(origin, output, state) if more else []
    if r.problems or source is None or output is None or state is None:
        raise ConfigError(r.problems or [f"{origin}: incomplete config"])
    objectstore.register(output)
    config = PipelineConfig(
        pipeline=pipeline,
        source=source,
        spark=spark,
        output=output,
        state=state,
        defaults=defaults,
        tables=tables,
        schedule=schedule,
        path=path,
        airflow=airflow,
    )
    lakes.register(output.integer_encoding, (output.path, config.staging_path))
    return config


def _source(r: Reader, data: Any, check_env: bool) -> SourceConfig | None:
    m = r.mapping(data, "source", section_keys(SourceConfig), {"host", "user", "server_id"})
    secrets = [k for k in ("password", "password_env", "airflow_conn_id") if m.get(k) is not None]
    if len(secrets) > 1:
        r.problem(
            "source",
            f"give only one of password, password_env, airflow_conn_id; found {', '.join(secrets)}",
        )
    password = m.get("password")
    if password is not None and not isinstance(password, str):
        r.problem("source.password", f"expected a string, found {kind_name(password)}")
        password = None
    env = r.value(m, "password_env", "source.password_env", str)
    if env and check_env and env not in os.environ:
        r.problem(
            "source.password_env",
            f"environment variable {env} is not set; export it (or use source.password)",
        )
    params = r.setting(m, "source.jdbc_url_params", SourceConfig, dict)
    if not all(isinstance(k, str) for k in params):
        r.problem("source.jdbc_url_params", "keys must be strings")
    for key in params:
        if str(key).lower() in _SET_BY_TIDEMARK:
            r.problem(
                f"source.jdbc_url_params.{key}",
                "is set by Tidemark: the values read depend on it "
                "(the session's time zone comes from source.time_zone); remove it",
            )
        elif str(key).lower() in _TIMEOUTS:
            r.problem(
                f"source.jdbc_url_params.{key}",
                f"is set from {_TIMEOUTS[str(key).lower()]} (seconds), "
                "which the other source connections use too; set that instead",
            )
    host = r.value(m, "host", "source.host", str, "")
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it
        host = host[1:-1]
    user = r.value(m, "user", "source.user", str, "")
    server_id = r.value(m, "server_id", "source.server_id", int, 0, positive)
    tls = tls_section(r, m.get("tls"), params, check_env)
    if not isinstance(data, dict):
        return None
    return replace(_source_obj(r, m, host, user, server_id, password, env, params), tls=tls)


def _source_obj(
    r: Reader,
    m: dict[str, Any],
    host: str,
    user: str,
    server_id: int,
    password: str | None,
    env: str | None,
    params: dict[str, Any],
) -> SourceConfig:
    return SourceConfig(
        host=host,
        port=r.setting(m, "source.port", SourceConfig, int, _port),
        user=user,
        server_id=server_id,
        password=Secret(password) if password is not None else None,
        password_env=env,
        airflow_conn_id=r.value(m, "airflow_conn_id", "source.airflow_conn_id", str),
        jdbc_driver_jar=r.setting(m, "source.jdbc_driver_jar", SourceConfig, str),
        jdbc_url_params={str(k): str(v) for k, v in params.items()},
        time_zone=r.setting(m, "source.time_zone", SourceConfig, str, _time_zone),
        connect_timeout=r.setting(m, "source.connect_timeout", SourceConfig, int, positive),
        read_timeout=r.setting(m, "source.read_timeout", SourceConfig, int, positive),
    )


#: A Spark Connect URL: ``sc://host[:port][/;param=value...]``.
SPARK_REMOTE = re.compile(r"sc://[^/:;\s]+(:\d+)?(/(;[^;\s=]+=[^;\s]*)*)?")


def _spark(r: Reader, data: Any) -> SparkConfig:
    m = r.mapping(data, "spark", section_keys(SparkConfig), set())
    conf = r.setting(m, "spark.conf", SparkConfig, dict)
    objectstore.literal_secret_problems(r, "spark.conf", conf)
    for key, value in conf.items():
        if isinstance(value, dict | list):
            r.problem(
                f"spark.conf.{key}",
                "expected a single value (Spark's settings are flat: write "
                "the whole key, like spark.executor.memory: 4g)",
            )
    remote = r.value(
        m,
        "remote",
        "spark.remote",
        str,
        None,
        lambda v: (
            None
            if SPARK_REMOTE.match(v)
            else "expected a Spark Connect URL like sc://host:15002 (the value is not shown: "
            "it may hold a token)"
        ),
    )
    if remote is not None and "master" in m:
        r.problem(
            "spark",
            "give one of spark.master and spark.remote (a Spark Connect server has its own master)",
        )
    return SparkConfig(
        master=r.setting(m, "spark.master", SparkConfig, str),
        conf={str(k): str(v) for k, v in conf.items()},
        remote=remote,
    )


def _output(r: Reader, data: Any, check_env: bool) -> OutputConfig:
    m = r.mapping(data, "output", section_keys(OutputConfig), {"path"})
    path = r.value(m, "path", "output.path", str, "", storage_uri)
    staging = r.setting(m, "output.staging", OutputConfig, str, storage_uri)
    return OutputConfig(
        path=path,
        staging=staging,
        keep_versions=r.setting(m, "output.keep_versions", OutputConfig, int, positive),
        keep_hours=r.setting(
            m,
            "output.keep_hours",
            OutputConfig,
            float,
            lambda v: None if v >= 0 else f"must be >= 0, found {v}",
        ),
        integer_encoding=r.setting(
            m,
            "output.integer_encoding",
            OutputConfig,
            str,
            lambda v: (
                None
                if v in lakes.INTEGER_ENCODINGS
                else f"expected one of {', '.join(lakes.INTEGER_ENCODINGS)}, found {v!r}"
            ),
        ),
        catalog=_catalog(r, m.get("catalog", {})),
        s3=objectstore.read_s3(r, m.get("s3"), [path, staging], check_env),
    )


#: pyiceberg catalog types `output.catalog.type` takes.
CATALOG_TYPES = ("sql", "rest", "glue", "hive", "dynamodb", "bigquery", "in-memory")


def _catalog(r: Reader, data: Any) -> CatalogConfig:
    """``name`` and any pyiceberg catalog property, scalars only, ``type`` one pyiceberg knows."""
    objectstore.literal_secret_problems(r, "output.catalog", data)
    m = r.mapping(data, "output.catalog", set(data) if isinstance(data, dict) else set(), set())
    name = r.value(
        m,
        "name",
        "output.catalog.name",
        str,
        field_default(CatalogConfig, "name"),
        lambda v: (
            None if IDENTIFIER.match(v) else f"expected letters, digits, _ and $, found {v!r}"
        ),
    )
    properties: dict[str, str] = {}
    for key, value in m.items():
        if (
            key != "name"
            and r.value(m, key, f"output.catalog.{key}", (str, int, float, bool)) is not None
        ):
            properties[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    if properties.get("type", "sql") not in CATALOG_TYPES:
        r.problem(
            "output.catalog.type",
            f"expected one of {', '.join(CATALOG_TYPES)}, found {properties['type']!r}",
        )
    return CatalogConfig(name=name, properties=properties)


def _state(r: Reader, data: Any) -> StateConfig:
    m = r.mapping(data, "state", section_keys(StateConfig), {"url"})
    return StateConfig(
        url=r.value(m, "url", "state.url", str, ""),
        lock_lease_seconds=r.setting(
            m,
            "state.lock_lease_seconds",
            StateConfig,
            int,
            lambda v: None if v >= 2 else f"must be at least 2 (seconds), found {v}",
        ),
    )


def _defaults(r: Reader, data: Any) -> Defaults:
    m = r.mapping(data, "defaults", section_keys(Defaults), set())
    factor = r.setting(m, "defaults.even_distribution_factor", Defaults, list)
    if (
        len(factor) != 2
        or not all(isinstance(x, int | float) and x > 0 for x in factor)
        or factor[0] > factor[1]
    ):
        r.problem(
            "defaults.even_distribution_factor",
            f"expected [low, high] positive numbers, low <= high, found {factor}",
        )
        factor = field_default(Defaults, "even_distribution_factor")
    return Defaults(
        chunk_size=r.setting(m, "defaults.chunk_size", Defaults, int, chunk_rows),
        batch_chunks=r.setting(m, "defaults.batch_chunks", Defaults, int, positive),
        fetch_size=r.setting(m, "defaults.fetch_size", Defaults, int, positive),
        read_margin_seconds=r.setting(
            m,
            "defaults.read_margin_seconds",
            Defaults,
            float,
            lambda v: None if v >= 0 else f"must be >= 0, found {v}",
        ),
        even_distribution_factor=(float(factor[0]), float(factor[1])),
        expected_run_hours=r.setting(
            m,
            "defaults.expected_run_hours",
            Defaults,
            float,
            lambda v: None if v > 0 else f"must be > 0, found {v}",
        ),
        capture_batch_rows=r.setting(m, "defaults.capture_batch_rows", Defaults, int, positive),
        read_attempts=r.setting(m, "defaults.read_attempts", Defaults, int, positive),
    )
