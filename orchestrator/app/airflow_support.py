"""What the Airflow layer derives from pipeline configs, without importing Airflow.

`dags/` stays thin: it turns these plain values into Airflow objects. Everything
here is ordinary Python over `PipelineConfig`, usable (and tested) without an
Airflow install:

- which config files a configs folder holds and which of them are broken
  (`scan_configs`), with every problem naming the file and the key;
- names: DAG id, pool, the lock holder of a DAG run;
- the trigger params' JSON schemas and how a run request is read from them;
- each task's ``execution_timeout`` (`execution_timeouts`);
- Asset URIs and asset event extras; the DAG's ``doc_md``.

>>> run_holder("tidemark_shop", "manual__2026-01-01T00:00:00+00:00")
'airflow:tidemark_shop/manual__2026-01-01T00:00:00+00:00'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator.config import (
    DAG_ID_PREFIX,
    OutputConfig,
    PipelineConfig,
    StateConfig,
    load_config,
)
from orchestrator.config.patterns import takes
from orchestrator.config.sections import CHUNK_SIZE_MAX
from orchestrator.errors import ConfigError, RunFailed
from orchestrator.lake import storage
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.pipeline.failed import TablesFailed, failures
from orchestrator.pipeline.plan.batches import PACK_TABLES, TABLE_JOBS, BatchRef
from orchestrator.pipeline.publish.step import Published
from orchestrator.state.many import peek_table_set

#: Env var naming the folder of pipeline YAML files the DAGs are built from.
CONFIG_DIR_ENV = "TIDEMARK_CONFIG_DIR"
CONFIG_SUFFIXES = (".yaml", ".yml")


def dag_id(config: PipelineConfig) -> str:
    """The DAG id of a pipeline: ``tidemark_<pipeline>``."""
    return DAG_ID_PREFIX + config.pipeline


def pool_name(config: PipelineConfig) -> str:
    """The Airflow pool capping the pipeline's concurrent source connections."""
    return f"{DAG_ID_PREFIX}{config.pipeline}_source"


def pool_command(config: PipelineConfig, airflow: str | None = None) -> int:
    """``tidemark airflow-pool``: create or update the pipeline's pool with ``airflow.pool_slots``.

    Runs Airflow's own ``airflow pools set`` (the supported way in; DAG parsing must not
    write to Airflow's database), with the environment given (``AIRFLOW_HOME`` ...).

    Args:
        config: the pipeline.
        airflow: the ``airflow`` executable; default: beside this Python, else on PATH.
    """
    name, slots = pool_name(config), config.airflow.pool_slots
    command = [
        airflow or _airflow_executable(),
        "pools",
        "set",
        name,
        str(slots),
        f"Tidemark {config.pipeline}: source connections",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    except FileNotFoundError:
        raise RunFailed(
            f"`airflow` is not installed here; where Airflow runs, run "
            f"`airflow pools set {name} {slots} ...` or this verb"
        ) from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RunFailed(
            f"`airflow pools set {name} {slots}` failed (exit {result.returncode}): "
            + " | ".join(tail)
        )
    print(f"pool {name}: {slots} slot(s)")
    return 0


def _airflow_executable() -> str:
    beside = Path(sys.executable).parent / "airflow"
    return str(beside) if beside.exists() else (shutil.which("airflow") or "airflow")


def run_holder(dag_id: str, run_id: str) -> str:
    """The state-store lock holder of one DAG run.

    Every task of a run, and every retry or clear of it, uses the same holder,
    so a resumed run keeps its lock while a different run is refused.
    """
    return f"airflow:{dag_id}/{run_id}"


# ------------------------------------------------------------------ configs folder


def config_dir(dags_file: str | os.PathLike[str]) -> Path:
    """``$TIDEMARK_CONFIG_DIR``, else the ``configs/`` folder next to the dags folder.

    Args:
        dags_file: the DAG file asking (its real location, symlinks resolved, anchors
            the default).
    """
    configured = os.environ.get(CONFIG_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(dags_file).resolve().parent.parent / "configs"


def config_files(folder: Path) -> list[Path]:
    """The pipeline YAML files of a folder, sorted by name (hidden files skipped)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() in CONFIG_SUFFIXES and not p.name.startswith(".")
    )


@dataclass
class ConfigScan:
    """The outcome of reading a configs folder: the good configs and every problem."""

    folder: Path
    configs: list[PipelineConfig] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def scan_configs(folder: Path) -> ConfigScan:
    """Load every pipeline config in ``folder`` the way the CLI does, collecting problems.

    No database or network is touched (``check_env=False``: a password env var is
    only needed where the tasks run). A config with a problem is left out of
    ``configs``; so is a second config reusing a pipeline name (both would make the
    same DAG id).
    """
    scan = ConfigScan(folder=folder)
    if not folder.is_dir():
        scan.problems.append(
            f"{folder}: the Tidemark configs folder does not exist; "
            f"create it or set {CONFIG_DIR_ENV}"
        )
        return scan
    owners: dict[str, Path] = {}
    for path in config_files(folder):
        try:  # relative paths are reported with every other problem, in one round
            config = load_config(path, check_env=False, more=relative_path_problems)
        except ConfigError as exc:
            scan.problems.extend(exc.problems)
            continue
        if config.pipeline in owners:
            scan.problems.append(
                f"{path}: pipeline: `{config.pipeline}` is already the pipeline of "
                f"{owners[config.pipeline]}; DAG ids must be unique, rename one"
            )
            continue
        owners[config.pipeline] = path
        scan.configs.append(config)
    return scan


def relative_path_problems(
    path: str, output: OutputConfig | None, state: StateConfig | None
) -> list[str]:
    """What makes a config unusable under Airflow: relative local paths (a `MoreChecks`).

    Every Airflow task runs in its own working directory, so a relative output path
    or SQLite file would land somewhere different for each task.
    """
    problems = []
    for key, value in (
        ("output.path", output and output.path),
        ("output.staging", output and output.staging),
    ):
        if value and "://" not in value and not os.path.isabs(os.path.expanduser(value)):
            problems.append(
                f"{path}: {key}: relative path {value!r} is ambiguous under Airflow "
                "(each task has its own working directory); use an absolute path or URI"
            )
    url = state.url if state else ""
    if (
        url.startswith("sqlite:///")
        and not url.startswith("sqlite:////")
        and url != "sqlite:///:memory:"
    ):
        problems.append(
            f"{path}: state.url: relative SQLite file {url!r} is ambiguous under Airflow; "
            "use sqlite:////absolute/path.db"
        )
    return problems


# ------------------------------------------------------------------ params


def table_choices(config: PipelineConfig, known: list[str] | None = None) -> list[str]:
    """What the trigger form's ``tables`` offers: every entry of ``tables`` (a pattern entry means
    all it matches), then the tables the patterns matched when a run was last planned (``known``;
    default: read from the state store without writing, `peek_table_set`).

    >>> from orchestrator.config import parse_config
    >>> c = parse_config({"pipeline": "p", "source": {"host": "h", "user": "u", "server_id": 1},
    ...     "output": {"path": "/l"}, "state": {"url": "sqlite://"},
    ...     "tables": [{"name": "crm.*"}, {"name": "shop.orders"}]})
    >>> table_choices(c, ["crm.b", "crm.a"])
    ['crm.*', 'shop.orders', 'crm.a', 'crm.b']
    """
    entries = [t.name for t in config.tables]
    if known is None:
        found = peek_table_set(config.state.url, config.pipeline) if config.has_patterns else None
        known = [name for m in (found.patterns if found else []) for name in m.get("tables", [])]
    return entries + sorted(set(known) - set(entries))


def params_schema(
    config: PipelineConfig, choices: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The trigger params as ``{name: {"default": ..., **json_schema}}`` (keyword args of
    ``Param``).

    ``tables`` also lists the choices (`table_choices`) as ``examples``: that is what turns an
    array param into a multi-select in the Airflow 3 trigger form, while
    ``items.enum`` makes Airflow refuse any other name. It accepts ``null`` because
    the form sends ``null`` when a selection is cleared.
    """
    names = table_choices(config) if choices is None else choices
    return {
        "tables": {
            "default": [],
            "type": ["array", "null"],
            "items": {"type": "string", "enum": names},
            "uniqueItems": True,
            "examples": names,
            "title": "Tables",
            "description": (
                "Tables for this run (empty: all; a pattern: all it matches). Published "
                "tables get a binlog catch-up unless Re-snapshot is on"
            ),
        },
        "snapshot": {
            "default": False,
            # "null" too: the trigger form marks a param required (*) unless its type allows null.
            "type": ["boolean", "null"],
            "title": "Re-snapshot",
            "description": "Snapshot the chosen tables again even if they are already published.",
        },
        "chunk_size": {
            "default": None,
            "type": ["null", "integer"],
            "minimum": 1,
            "maximum": CHUNK_SIZE_MAX,
            "title": "Chunk size",
            "description": "Target rows per chunk for this run's snapshots. "
            "Empty: the config's sizes.",
        },
    }


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What a DAG run was asked to do, read from its params."""

    tables: list[str] | None
    snapshot: bool
    chunk_size: int | None


def run_request(
    config: PipelineConfig, params: Mapping[str, Any], conf: Mapping[str, Any] | None = None
) -> RunRequest:
    """Read and check the run's params (Airflow validated their values at trigger time already).

    Args:
        config: the pipeline.
        params: the run's resolved params.
        conf: the run's conf as triggered; Airflow accepts any key in it, so a misspelt
            param (``tabels``) would otherwise start a normal run of every table.

    Raises:
        ConfigError: an unknown conf key, or a value the schema should have refused,
            naming the param.
    """
    valid = ("tables", "snapshot", "chunk_size")  # params_schema's keys
    unknown = sorted(set(conf or {}) - set(valid))
    if unknown:
        raise ConfigError(
            f"run conf: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}"
        )
    tables = params.get("tables") or None
    if tables is not None:
        if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
            raise ConfigError(f"param tables: expected a list of table names, found {tables!r}")
        patterns = {t.name for t in config.tables if t.pattern}  # a pattern entry: all it matches
        concrete = [t for t in tables if t not in patterns]
        if concrete:
            config.select_tables(concrete)
    snapshot = params.get("snapshot")
    snapshot = False if snapshot is None else snapshot
    if not isinstance(snapshot, bool):
        raise ConfigError(f"param snapshot: expected true or false, found {snapshot!r}")
    chunk_size = params.get("chunk_size")
    if chunk_size is not None and (
        isinstance(chunk_size, bool)
        or not isinstance(chunk_size, int)
        or not 1 <= chunk_size <= CHUNK_SIZE_MAX
    ):
        raise ConfigError(
            f"param chunk_size: expected an integer from 1 to {CHUNK_SIZE_MAX} or null, "
            f"found {chunk_size!r}"
        )
    return RunRequest(
        tables=list(tables) if tables else None, snapshot=snapshot, chunk_size=chunk_size
    )


# ------------------------------------------------------------------ task timeouts

#: Multiples of ``source.read_timeout`` a task may run before Airflow fails it (then retries it;
#: the run resumes). The source's own timeouts end a hung source's query within one
#: read_timeout; these are the backstop for what they cannot see (a stuck JVM, a lost executor).
#: the checks and planning: many short queries (outcome: one); capture, reconcile, publish: grow
#: with the changes and the table, so they get the most.
SOURCE_STEP_FACTOR = 6
DATA_STEP_FACTOR = 48


def execution_timeouts(config: PipelineConfig) -> dict[str, timedelta]:
    """Each task's ``execution_timeout``, derived from ``source.read_timeout``.

    A read task runs one batch: each chunk's statement is bounded by read_timeout (JDBC
    ``queryTimeout``), so even one chunk at a time, ``batch_chunks`` of them (or a batch of
    `PACK_TABLES` small tables read `TABLE_JOBS` at a time: as many rounds), in ``read_attempts``
    tries, it ends within ``(rounds * read_attempts + 1) * read_timeout``. ``plan`` checks the
    source and plans (two source steps) and gets capture's, reconcile's and publish's time too: a
    run with nothing to read does them in it.

    >>> from orchestrator.config import parse_config
    >>> cfg = parse_config({"pipeline": "p", "source": {"host": "h", "user": "u", "server_id": 1,
    ...     "password": "x", "read_timeout": 60}, "output": {"path": "/tmp/l"},
    ...     "state": {"url": "sqlite:///:memory:"}, "tables": [{"name": "d.t"}]})
    >>> {k: int(v.total_seconds()) for k, v in execution_timeouts(cfg).items()}
    {'plan': 9360, 'read': 5820, 'capture': 2880, 'reconcile': 2880, 'publish': 2880, \
'outcome': 360}
    """
    seconds = config.source.read_timeout
    rounds = max(
        [
            config.defaults.batch_chunks,
            *(t.batch_chunks for t in config.tables),
            -(-PACK_TABLES // TABLE_JOBS),
        ]
    )
    read = (rounds * config.defaults.read_attempts + 1) * seconds
    source_step = timedelta(seconds=SOURCE_STEP_FACTOR * seconds)
    data_step = timedelta(seconds=DATA_STEP_FACTOR * seconds)
    return {
        "plan": 2 * source_step + 3 * data_step,
        "read": timedelta(seconds=read),
        "capture": data_step,
        "reconcile": data_step,
        "publish": data_step,
        "outcome": source_step,
    }


# ------------------------------------------------------------------ XCom and assets


def batch_xcom(batch: BatchRef) -> dict[str, Any]:
    """A batch as the JSON a mapped read task gets (ids and a label only, no secrets)."""
    return asdict(batch)


def batches_xcom(
    run_id: str, batches: Sequence[BatchRef], max_map_length: int
) -> list[dict[str, Any]]:
    """What ``plan`` returns for the mapped ``read`` tasks: one `batch_xcom` per batch.

    Raises:
        ConfigError: more batches than Airflow maps from one task's return value (``[core]
            max_map_length``): Airflow would fail ``plan`` with no word of why, at every retry.
            The run stays planned, so raising the limit and clearing ``plan`` resumes it.

    >>> refs = [BatchRef(i, "d.t", 16, f"d.t chunks {16 * i}-{16 * i + 15}") for i in range(3)]
    >>> [b["label"] for b in batches_xcom("r1", refs, 3)]
    ['d.t chunks 0-15', 'd.t chunks 16-31', 'd.t chunks 32-47']
    >>> batches_xcom("r1", refs, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    orchestrator.errors.ConfigError: run r1 has 3 batches to read, ... max_map_length = 2): ...
    """
    if len(batches) > max_map_length:
        raise ConfigError(
            f"run {run_id} has {len(batches)} batches to read, one mapped read task each, more "
            f"than Airflow maps ([core] max_map_length = {max_map_length}): raise it above "
            f"{len(batches)} (AIRFLOW__CORE__MAX_MAP_LENGTH, on the scheduler, API server and "
            "workers) and clear the plan task, which resumes the run; or finish the run with "
            "`tidemark run` (no such limit). Later snapshots make fewer batches with a larger "
            "chunk_size or batch_chunks"
        )
    return [batch_xcom(b) for b in batches]


def asset_uri(config: PipelineConfig, table: str) -> str:
    """The Asset URI of a table: its output directory, the Iceberg table's location;
    ``file://`` + absolute path when local.

    >>> from orchestrator.config import parse_config
    >>> c = parse_config({"pipeline": "p", "source": {"host": "h", "user": "u", "server_id": 1},
    ...                   "output": {"path": "/lake/"}, "state": {"url": "sqlite://"},
    ...                   "tables": [{"name": "shop.orders"}]})
    >>> asset_uri(c, "shop.orders")
    'file:///lake/shop/orders'
    """
    directory = table_dir(config, table)
    if storage.is_local(directory):
        return "file://" + storage.local_path(directory)
    return directory


def alias_name(config: PipelineConfig, pattern: str) -> str:
    """The AssetAlias of a pattern entry: its published tables' Assets are added to it.

    >>> from orchestrator.config import parse_config
    >>> c = parse_config({"pipeline": "p", "source": {"host": "h", "user": "u", "server_id": 1},
    ...                   "output": {"path": "/lake/"}, "state": {"url": "sqlite://"},
    ...                   "tables": [{"name": "crm.*"}]})
    >>> alias_name(c, "crm.*"), pattern_of(c, "crm.accounts"), pattern_of(c, "shop.x")
    ('tidemark_p:crm.*', 'crm.*', None)
    """
    return f"{dag_id(config)}:{pattern}"


def caught_up_alias_name(config: PipelineConfig) -> str:
    """The AssetAlias through which ``plan`` announces the tables of entries of their own when it
    published a run with nothing to read itself (a task declaring the Assets would emit an event
    for each whenever it succeeds, a snapshot's ``plan`` too). A table name has a dot and a
    pattern a wildcard, so no pattern entry's alias takes this name.

    >>> from orchestrator.config import parse_config
    >>> c = parse_config({"pipeline": "p", "source": {"host": "h", "user": "u", "server_id": 1},
    ...                   "output": {"path": "/lake/"}, "state": {"url": "sqlite://"},
    ...                   "tables": [{"name": "shop.orders"}]})
    >>> caught_up_alias_name(c)
    'tidemark_p:caught-up'
    """
    return f"{dag_id(config)}:caught-up"


def pattern_of(config: PipelineConfig, table: str) -> str | None:
    """The pattern entry that configures ``table`` (None: an entry of its own, or none)."""
    if any(not t.pattern and t.name == table for t in config.tables):
        return None
    return next((t.name for t in config.tables if t.pattern and takes(t, table)), None)


def asset_extra(published: Published, run_id: str) -> dict[str, Any]:
    """The extra of a table's asset event: what was published, at which binlog position, and
    the Iceberg snapshot (``iceberg``: catalog, identifier, metadata_location, snapshot_id).

    ``published`` is False when the run found no change in the table: ``version`` and
    ``iceberg`` are then those of the earlier run, and ``position`` the one checked up to."""
    return {
        "published": published.changed,
        "table": published.table,
        "version": published.version,
        "rows": published.rows,
        "position": dict(published.position),
        "run_id": run_id,
        "iceberg": dict(published.iceberg) if published.iceberg else None,
    }


def not_published_extra(
    table: str, run_id: str, failure: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The extra of an asset event for a table the run did not publish: an ad hoc run of others,
    or a table that failed on its own (``failure``: its ``step`` and ``reason``).

    Airflow records an event for every declared outlet of a successful task; this
    one tells consumers that the table did not change.
    """
    extra: dict[str, Any] = {"published": False, "table": table, "run_id": run_id}
    if failure is not None:
        extra["failed"] = {"step": failure.get("step", "plan"), "reason": failure.get("reason", "")}
    return extra


def tables_failed(config: PipelineConfig, run_id: str) -> TablesFailed | None:
    """The error of a run that ended ``partial`` (tables failed on their own), None otherwise."""
    store = open_store(config)
    try:
        if store.get_run(run_id).status != "partial":
            return None
        published = [t for t, _, status in store.run_table_states(run_id) if status == "published"]
        return TablesFailed(run_id, failures(store, run_id), config.path, published)
    finally:
        store.close()


def doc_md(config: PipelineConfig) -> str:
    """The DAG's documentation: where it comes from, what it snapshots, where to."""
    lines = [
        f"# Tidemark pipeline `{config.pipeline}`",
        "",
        f"Built from `{config.path}`. Consistent, lock-free snapshots of the tables below into "
        f"`{config.output.path}`, kept current from the binlog by later runs.",
        "",
        "| table | chunk key | chunk size | chunks per batch | filter |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in config.tables:
        key = ", ".join(t.chunk_key) if t.chunk_key else "primary key"
        name = f"`{t.name}`" + (
            f" (pattern; exclude {', '.join(f'`{x}`' for x in t.exclude)})"
            if t.exclude
            else " (pattern)"
            if t.pattern
            else ""
        )
        lines.append(
            f"| {name} | {key} | {t.chunk_size:,} | {t.batch_chunks} | "
            f"{'`' + t.where + '`' if t.where else ''} |"
        )
    lines += [
        "",
        f"Source `{config.source.host}:{config.source.port}` as `{config.source.user}`; "
        f"schedule: {config.schedule or 'none (manual)'}; source connections capped by the pool "
        f"`{pool_name(config)}` ({config.airflow.pool_slots} slots: "
        "`tidemark airflow-pool` sets it).",
        "",
        "Trigger with **Tables** to run only those tables (a published table gets a binlog "
        "catch-up unless **Re-snapshot** is on), **Chunk size** to override chunk sizes for the "
        "run. "
        "A table with no change since its version keeps it (no new version or Iceberg snapshot; "
        "its asset event says `published: false` with the position checked up to). "
        "Any other key in the run's conf fails the run at `plan`, before the source is asked. "
        "A failed run resumes when cleared or triggered again.",
    ]
    return "\n".join(lines)
