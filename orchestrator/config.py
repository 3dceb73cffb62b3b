"""Pipeline config: YAML in, validated frozen dataclasses out.

Every problem found is collected and reported together as one `ConfigError`,
each line naming the file, the key path, what was expected and what was found.
Secrets are held in `Secret`, whose repr never shows the value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config_sections import (
    DEFAULT_JDBC_JAR,
    AirflowConfig,
    CatalogConfig,
    Defaults,
    OutputConfig,
    SourceConfig,
    SparkConfig,
    StateConfig,
    TableConfig,
)
from orchestrator.credentials import Secret, resolve_password
from orchestrator.errors import ConfigError
from orchestrator.schema.filters import check_filter

__all__ = ["DEFAULT_JDBC_JAR", "AirflowConfig", "CatalogConfig", "ConfigError", "Defaults", "OutputConfig",
           "PipelineConfig", "SourceConfig", "SparkConfig", "StateConfig", "TableConfig",
           "field_default", "load_config", "parse_config"]

PIPELINE_NAME = re.compile(r"^[a-z0-9_]+$")
IDENTIFIER = re.compile(r"^[A-Za-z0-9_$]+$")
TABLE_NAME = re.compile(r"^[A-Za-z0-9_$]+\.[A-Za-z0-9_$]+$")

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

    def table(self, name: str) -> TableConfig:
        for table in self.tables:
            if table.name == name:
                return table
        known = ", ".join(t.name for t in self.tables)
        raise ConfigError(f"table `{name}` is not in pipeline `{self.pipeline}`; configured: {known}")

    def table_where(self, name: str) -> str | None:
        """The ``where`` filter of a configured table (None: none, or no longer configured)."""
        return next((t.where for t in self.tables if t.name == name), None)

    def select_tables(self, names: list[str] | None) -> tuple[TableConfig, ...]:
        """The configured tables named (all when ``names`` is empty), in config order."""
        if not names:
            return self.tables
        missing = [n for n in names if n not in {t.name for t in self.tables}]
        if missing:
            known = ", ".join(t.name for t in self.tables)
            raise ConfigError(
                f"table(s) {', '.join(missing)} not in pipeline `{self.pipeline}`; configured: {known}"
            )
        return tuple(t for t in self.tables if t.name in names)

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
        return resolve_password(self.source.password, self.source.password_env, self.source.airflow_conn_id)


# --------------------------------------------------------------------------- loading


class _Reader:
    """Walks a parsed YAML mapping, collecting problems instead of stopping at the first."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.problems: list[str] = []

    def problem(self, key: str, message: str) -> None:
        self.problems.append(f"{self.origin}: {key}: {message}")

    def mapping(self, data: Any, key: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.problem(key, f"expected a mapping, found {_kind(data)}")
            return {}
        for unknown in sorted(set(data) - allowed, key=str):
            self.problem(f"{key}.{unknown}" if key else str(unknown),
                         f"unknown key; expected one of {', '.join(sorted(allowed))}")
        for missing in sorted(required - set(data)):
            self.problem(f"{key}.{missing}" if key else missing, "missing required key")
        return data

    def setting(self, data: Mapping[str, Any], path: str, section: type[Any], kind: type | tuple[type, ...],
                check: Callable[[Any], str | None] | None = None) -> Any:
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
            self.problem(path, f"expected {_names(kinds)}, found boolean {value}")
            return default
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            self.problem(path, f"expected {_names(kinds)}, found {_kind(value)} {value!r}")
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
    (50000, {})
    """
    for declared in fields(cls):
        if declared.name == name:
            if declared.default_factory is not MISSING:
                return declared.default_factory()
            if declared.default is not MISSING:
                return declared.default
    raise TypeError(f"{cls.__name__}.{name} declares no default")


def _keys(cls: type[Any]) -> set[str]:
    """The keys a config section takes: its dataclass's fields."""
    return {declared.name for declared in fields(cls)}


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer",
            float: "a number", bool: "a boolean", type(None): "nothing"}.get(type(value), type(value).__name__)


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join({int: "an integer", str: "a string", float: "a number", bool: "a boolean",
                        dict: "a mapping", list: "a list"}.get(k, k.__name__) for k in kinds)


def _positive(value: Any) -> str | None:
    return None if value > 0 else f"must be a positive integer, found {value}"


def _port(value: int) -> str | None:
    return None if 0 < value < 65536 else f"must be a TCP port 1..65535, found {value}"


def load_config(path: str | os.PathLike[str], *, check_env: bool = True,
                more: MoreChecks | None = None) -> PipelineConfig:
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
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config file: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{file}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    return parse_config(data, origin=str(file), path=file, check_env=check_env, more=more)


def parse_config(
    data: Any, *, origin: str = "<config>", path: Path | None = None, check_env: bool = True,
    more: MoreChecks | None = None) -> PipelineConfig:
    """Validate an already parsed config mapping (see `load_config`)."""
    r = _Reader(origin)
    top = r.mapping(data, "", {"pipeline", "schedule", "source", "spark", "output", "state",
                               "defaults", "tables", "airflow"},
                    {"pipeline", "source", "output", "state", "tables"})
    pipeline = r.value(top, "pipeline", "pipeline", str, "",
                       lambda v: None if PIPELINE_NAME.match(v)
                       else f"must match [a-z0-9_]+ (it names the DAG tidemark_<pipeline>), found {v!r}")
    schedule = r.value(top, "schedule", "schedule", str)
    source = _source(r, top.get("source"), check_env) if "source" in top else None
    spark = _spark(r, top.get("spark", {}))
    output = _output(r, top.get("output")) if "output" in top else None
    state = _state(r, top.get("state")) if "state" in top else None
    defaults = _defaults(r, top.get("defaults", {}))
    tables = _tables(r, top.get("tables"), defaults) if "tables" in top else ()
    m = r.mapping(top.get("airflow", {}), "airflow", _keys(AirflowConfig), set())
    airflow = AirflowConfig(pool_slots=r.setting(m, "airflow.pool_slots", AirflowConfig, int, _positive))
    r.problems += more(origin, output, state) if more else []
    if r.problems or source is None or output is None or state is None:
        raise ConfigError(r.problems or [f"{origin}: incomplete config"])
    return PipelineConfig(pipeline=pipeline, source=source, spark=spark, output=output,
                          state=state, defaults=defaults, tables=tables, schedule=schedule,
                          path=path, airflow=airflow)


def _source(r: _Reader, data: Any, check_env: bool) -> SourceConfig | None:
    m = r.mapping(data, "source", _keys(SourceConfig), {"host", "user", "server_id"})
    secrets = [k for k in ("password", "password_env", "airflow_conn_id") if m.get(k) is not None]
    if len(secrets) > 1:
        r.problem("source", f"give only one of password, password_env, airflow_conn_id; found {', '.join(secrets)}")
    password = m.get("password")
    if password is not None and not isinstance(password, str):
        r.problem("source.password", f"expected a string, found {_kind(password)}")
        password = None
    env = r.value(m, "password_env", "source.password_env", str)
    if env and check_env and env not in os.environ:
        r.problem("source.password_env",
                  f"environment variable {env} is not set; export it (or use source.password)")
    params = r.setting(m, "source.jdbc_url_params", SourceConfig, dict)
    if not all(isinstance(k, str) for k in params):
        r.problem("source.jdbc_url_params", "keys must be strings")
    host = r.value(m, "host", "source.host", str, "")
    user = r.value(m, "user", "source.user", str, "")
    server_id = r.value(m, "server_id", "source.server_id", int, 0, _positive)
    if not isinstance(data, dict):
        return None
    return _source_obj(r, m, host, user, server_id, password, env, params)


def _source_obj(r: _Reader, m: dict[str, Any], host: str, user: str, server_id: int,
                password: str | None, env: str | None, params: dict[str, Any]) -> SourceConfig:
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
        time_zone=r.setting(m, "source.time_zone", SourceConfig, str),
        connect_timeout=r.setting(m, "source.connect_timeout", SourceConfig, int, _positive),
        read_timeout=r.setting(m, "source.read_timeout", SourceConfig, int, _positive),
    )


def _spark(r: _Reader, data: Any) -> SparkConfig:
    m = r.mapping(data, "spark", _keys(SparkConfig), set())
    conf = r.setting(m, "spark.conf", SparkConfig, dict)
    return SparkConfig(master=r.setting(m, "spark.master", SparkConfig, str),
                       conf={str(k): str(v) for k, v in conf.items()})


def _output(r: _Reader, data: Any) -> OutputConfig:
    m = r.mapping(data, "output", _keys(OutputConfig), {"path"})
    return OutputConfig(path=r.value(m, "path", "output.path", str, ""),
                        staging=r.setting(m, "output.staging", OutputConfig, str),
                        keep_versions=r.setting(m, "output.keep_versions", OutputConfig, int, _positive),
                        keep_hours=r.setting(m, "output.keep_hours", OutputConfig, float,
                                             lambda v: None if v >= 0 else f"must be >= 0, found {v}"),
                        catalog=_catalog(r, m.get("catalog", {})))


#: pyiceberg catalog types `output.catalog.type` takes.
CATALOG_TYPES = ("sql", "rest", "glue", "hive", "dynamodb", "bigquery", "in-memory")


def _catalog(r: _Reader, data: Any) -> CatalogConfig:
    """``name`` and any pyiceberg catalog property, scalars only, ``type`` one pyiceberg knows."""
    m = r.mapping(data, "output.catalog", set(data) if isinstance(data, dict) else set(), set())
    name = r.value(m, "name", "output.catalog.name", str, field_default(CatalogConfig, "name"),
                   lambda v: None if IDENTIFIER.match(v) else f"expected letters, digits and _, found {v!r}")
    properties: dict[str, str] = {}
    for key, value in m.items():
        if key != "name" and r.value(m, key, f"output.catalog.{key}", (str, int, float, bool)) is not None:
            properties[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    if properties.get("type", "sql") not in CATALOG_TYPES:
        r.problem("output.catalog.type", f"expected one of {', '.join(CATALOG_TYPES)}, found {properties['type']!r}")
    return CatalogConfig(name=name, properties=properties)


def _state(r: _Reader, data: Any) -> StateConfig:
    m = r.mapping(data, "state", _keys(StateConfig), {"url"})
    return StateConfig(url=r.value(m, "url", "state.url", str, ""),
                       lock_lease_seconds=r.setting(m, "state.lock_lease_seconds", StateConfig, int,
                                                    lambda v: None if v >= 2 else f"must be at least 2 (seconds), found {v}"))


def _defaults(r: _Reader, data: Any) -> Defaults:
    m = r.mapping(data, "defaults", _keys(Defaults), set())
    factor = r.setting(m, "defaults.even_distribution_factor", Defaults, list)
    if len(factor) != 2 or not all(isinstance(x, int | float) and x > 0 for x in factor) or factor[0] > factor[1]:
        r.problem("defaults.even_distribution_factor", f"expected [low, high] positive numbers, low <= high, found {factor}")
        factor = field_default(Defaults, "even_distribution_factor")
    return Defaults(
        chunk_size=r.setting(m, "defaults.chunk_size", Defaults, int, _positive),
        batch_chunks=r.setting(m, "defaults.batch_chunks", Defaults, int, _positive),
        fetch_size=r.setting(m, "defaults.fetch_size", Defaults, int, _positive),
        read_margin_seconds=r.setting(m, "defaults.read_margin_seconds", Defaults, float,
                                      lambda v: None if v >= 0 else f"must be >= 0, found {v}"),
        even_distribution_factor=(float(factor[0]), float(factor[1])),
        expected_run_hours=r.setting(m, "defaults.expected_run_hours", Defaults, float,
                                     lambda v: None if v > 0 else f"must be > 0, found {v}"),
        capture_batch_rows=r.setting(m, "defaults.capture_batch_rows", Defaults, int, _positive),
        read_attempts=r.setting(m, "defaults.read_attempts", Defaults, int, _positive),
    )


def _tables(r: _Reader, data: Any, defaults: Defaults) -> tuple[TableConfig, ...]:
    if not isinstance(data, list) or not data:
        r.problem("tables", f"expected a non-empty list of tables, found {_kind(data)}")
        return ()
    tables: list[TableConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(data):
        key = f"tables[{i}]"
        m = r.mapping(item, key, _keys(TableConfig), {"name"})
        name = r.value(m, "name", f"{key}.name", str, "",
                       lambda v: None if TABLE_NAME.match(v)
                       else f"expected `database.table` (letters, digits, _ and $), found {v!r}")
        if name and name in seen:
            r.problem(f"{key}.name", f"table {name} is listed twice")
        seen.add(name)
        chunk_key = m.get("chunk_key")
        if isinstance(chunk_key, str):
            chunk_key = [chunk_key]
        if chunk_key is not None and (
            not isinstance(chunk_key, list) or not chunk_key
            or not all(isinstance(c, str) and IDENTIFIER.match(c) for c in chunk_key)
        ):
            r.problem(f"{key}.chunk_key", f"expected a column name or a list of column names, found {chunk_key!r}")
            chunk_key = None
        tables.append(TableConfig(
            name=name,
            chunk_size=r.value(m, "chunk_size", f"{key}.chunk_size", int, defaults.chunk_size, _positive),
            batch_chunks=r.value(m, "batch_chunks", f"{key}.batch_chunks", int, defaults.batch_chunks, _positive),
            chunk_key=tuple(chunk_key) if chunk_key else None,
            where=r.value(m, "where", f"{key}.where", str, None, check_filter),
        ))
    return tuple(tables)
