"""`tidemark doctor` and the run's preflight: is the source ready for Tidemark?

Each check is one `Check` naming the setting, what was found and the fix. The
checks: the server is reachable; the binlog is on, ROW, with full row images
(and full row metadata where the server has the variable), without a binlog filter
(``binlog_do_db``/``binlog_ignore_db``); the user holds
SELECT on every table, REPLICATION SLAVE and REPLICATION CLIENT (in the
server's dialect); every table exists, has a chunk key the planner accepts
(`choose_chunk_key`, so doctor and run never disagree) and only mappable column
types; the configured ``source.server_id`` differs from the server's own; binlog
retention outlasts a run (``defaults.expected_run_hours``); no column is named like
Tidemark's own (``_tm_...``); GTIDs (recommended), and a
replica writes what it replicates to its binlog (`orchestrator.binlog.topology`); the foreign-key
cascades that can change the tables' rows and what Tidemark does with each
(`orchestrator.app.cascade_checks`). `doctor`
(not the run's preflight, whose failures mean "source not ready") also checks where a run
writes: output and staging writable, their free space, the state store and the Iceberg
catalog (`orchestrator.app.preflight`); and that every position the state store goes on from is
still on the server and is its own, or can be carried to it by GTID.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import pymysql

from orchestrator.app.cascade_checks import cascade_checks
from orchestrator.app.preflight import lake_checks
from orchestrator.binlog import versioned
from orchestrator.binlog.topology import identity_checks, replica_check
from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import ConfigError, RunFailed, SourceNotReady
from orchestrator.pipeline import keyless
from orchestrator.pipeline.changes import RESERVED_PREFIX, reserved_columns
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.schema import charsets
from orchestrator.schema.families import SPATIAL_TYPES
from orchestrator.schema.tables import TableInfo, unkept
from orchestrator.schema.types import UnsupportedType, arrow_type
from orchestrator.source.check import Check
from orchestrator.source.connection import Source
from orchestrator.source.connection_limit import connection_limit_check
from orchestrator.source.grants import privilege_checks
from orchestrator.source.kept import binlog_kept_checks
from orchestrator.source.listing import Shapes, shapes_at, table_set, tables_info
from orchestrator.source.retry import transient_retry
from orchestrator.source.snapshot import SnapshotMethod, how_to_snapshot
from orchestrator.source.tls import TLS_STATUS, tls_check

# --------------------------------------------------------------------------- entry points


def run_checks(config: PipelineConfig, tables: list[str] | None = None) -> list[Check]:
    """Every check against the live source; stops after the first if it cannot connect.

    Args:
        config: the pipeline.
        tables: the tables to check: tables or pattern entries (all of the pipeline's when empty
            or None; patterns are expanded over the source's tables, one check line each).

    Raises:
        ConfigError: a named table is not in the pipeline, or the password env var is unset.
    """
    return _checks(config, tables, cascades=True)[0]


def _checks(
    config: PipelineConfig, tables: list[str] | None, *, cascades: bool = False
) -> tuple[list[Check], list[str], Shapes | None]:
    """`run_checks`, the names of the tables checked, and their shapes with the position they
    were read after (None when the binlog is off: a check failed); ``cascades``: with the
    lines about foreign-key cascades, which only inform (the run's preflight leaves them out:
    its plan reads the same keys)."""
    source = Source(
        config.source, config.resolve_password(), retry=transient_retry(attempts=3, max_wait=2.0)
    )
    with source:
        try:
            checks = [_reachable(source)]
        except SourceNotReady as exc:
            return [Check("reachable", False, str(exc))], [], None
        found = table_set(config, source)
        selected = found.select(tables)
        checks += [Check(f"pattern {m.pattern}", True, str(m)) for m in found.patterns]
        checks += _binlog_settings(source)
        checks += _binlog_filters(source)
        checks.append(replica_check(source))
        checks.append(_retention(source, config.defaults.expected_run_hours))
        checks.append(_server_id(source, config.source.server_id))
        checks.append(connection_limit_check(config, source))
        checks.append(tls_check(config.source, dict(source.query(TLS_STATUS))))
        checks += privilege_checks(source, selected)
        names = [t.name for t in selected]
        try:  # read after a position, so that the run's plan may use them (`Shapes`)
            shapes: Shapes | None = shapes_at(source, names)
        except (SourceNotReady, RunFailed, pymysql.err.MySQLError):  # binlog off or not
            shapes = None  # visible (its checks say so), or a server that changed meanwhile
        infos = tables_info(source, names) if shapes is None else shapes.infos
        for table in selected:
            entry = config.tables[found.entry_index(table.name)]
            checks += _table_checks(
                source, table, found.entry_index(table.name), infos.get(table.name), entry.pattern
            )
        if cascades:
            checks += cascade_checks(config, source, [t.name for t in selected if t.name in infos])
    return checks, names, shapes


@dataclass(frozen=True, slots=True)
class Preflight:
    """What a run's preflight found: the tables that failed a check of their own, each with its
    line (the run records them failed and goes on without them), and the shapes it read after
    a position (`Shapes`: the run's plan takes them rather than reading them again)."""

    failing: dict[str, str]
    shapes: Shapes | None


def preflight(config: PipelineConfig, tables: list[str] | None = None) -> Preflight:
    """Raise `SourceNotReady` listing every failed check, one per line, when a check of the
    source failed or every table failed one; else return the tables that failed a check of
    their own with its line, and the shapes read (`Preflight`).

    Args:
        config: the pipeline.
        tables: the run's tables or pattern entries (all of the pipeline's when empty or None).
    """
    checks, names, shapes = _checks(config, tables)
    selected = set(names)
    failed = [c for c in checks if not c.ok]
    own: dict[str, list[str]] = {}
    for check in failed:
        for table in check.tables:
            own.setdefault(table, []).append(check.line().removeprefix("FAIL  "))
    if any(not c.tables for c in failed) or (failed and selected <= own.keys()):
        raise SourceNotReady("\n".join(c.line().removeprefix("FAIL  ") for c in failed))
    return Preflight({table: "; ".join(lines) for table, lines in own.items()}, shapes)


def doctor_command(config: PipelineConfig) -> int:
    """Print one line per check on stdout; return 0 if all pass, 3 otherwise.

    When some fail, stderr gets one summary line (or the connection error itself).
    """
    checks, tables, _ = _checks(config, None, cascades=True)
    if checks[0].ok:  # reachable: where the run writes is checked too (not by run's preflight)
        with Source.from_pipeline(config) as source:
            checks += lake_checks(config, source, tables)
            try:
                kept = [name for name, _ in source.binlogs()]
            except (
                SourceNotReady,
                pymysql.err.MySQLError,
            ):  # binlog off or not visible: failed above
                kept = None
            if kept is not None:
                checks += binlog_kept_checks(config, kept, source.identity())
                checks += identity_checks(config, source)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if not c.ok]
    if not failed:
        print(
            f"doctor: all {len(checks)} checks passed; {config.source.host}:{config.source.port} "
            f"is ready for pipeline {config.pipeline}"
        )
        return 0
    if failed[0].name == "reachable":
        print(f"tidemark: error: {failed[0].detail}", file=sys.stderr)
    else:
        names = ", ".join(c.name for c in failed)
        print(
            f"tidemark: error: doctor: {len(failed)} of {len(checks)} checks failed: {names}",
            file=sys.stderr,
        )
    return SourceNotReady.exit_code


# --------------------------------------------------------------------------- server


def _reachable(source: Source) -> Check:
    version = source.server_version()
    return Check(
        "reachable",
        True,
        f"{source.dialect.name} {version} at {source.address} as {source.current_user()}",
    )


@dataclass(frozen=True, slots=True)
class _Setting:
    """A server setting doctor checks: ``required`` fails unless it is ``wanted``;
    ``recommended`` passes either way, saying why ``wanted`` is better; ``info`` reports it."""

    name: str
    wanted: str
    fix: str
    optional: bool = False  # absent on older servers: skip
    level: Literal["required", "recommended", "info"] = "required"
    why: str = ""


def _dynamic_fix(name: str, value: str) -> str:
    return (
        f"SET GLOBAL {name} = '{value}' and in my.cnf: {name} = {value} "
        "(sessions already open keep the old value until they reconnect)"
    )


_SETTINGS = (
    _Setting(
        "log_bin",
        "ON",
        "in my.cnf set log_bin = binlog (with a server_id), then restart the server",
    ),
    _Setting("binlog_format", "ROW", _dynamic_fix("binlog_format", "ROW")),
    _Setting("binlog_row_image", "FULL", _dynamic_fix("binlog_row_image", "FULL")),
    # Without it a TABLE_MAP carries only types: a rename, a swap of two columns of one type, new
    # ENUM/SET labels or another charset are then seen only by the DDL statement, not the map.
    _Setting(
        "binlog_row_metadata",
        "FULL",
        _dynamic_fix("binlog_row_metadata", "FULL"),
        optional=True,
        level="recommended",
        why="with FULL each TABLE_MAP names the columns, their signedness, charsets and "
        "ENUM/SET labels, and Tidemark re-reads a table whose shape changed unseen",
    ),
    # Compressed events are decoded (orchestrator.binlog.compressed): reported, never a failure.
    _Setting(
        "log_bin_compress",
        "OFF",
        "",
        optional=True,
        level="info",
        why="compressed events are decoded",
    ),
    _Setting(
        "binlog_transaction_compression",
        "OFF",
        "",
        optional=True,
        level="info",
        why="compressed transactions are decoded",
    ),
    # Positions carry the GTID set: a pipeline pointed at another server of the topology (a
    # failover, a new replica) goes on by GTID (orchestrator.binlog.failover), else re-reads.
    _Setting(
        "gtid_mode",
        "ON",
        "set gtid_mode = ON step by step (OFF_PERMISSIVE, ON_PERMISSIVE, ON) "
        "with enforce_gtid_consistency = ON",
        optional=True,
        level="recommended",
        why="positions then carry GTID sets, and a pipeline pointed at another server of the "
        "topology (a failover) goes on by GTID instead of reading every table again",
    ),
    _Setting(
        "gtid_strict_mode",
        "ON",
        _dynamic_fix("gtid_strict_mode", "ON"),
        optional=True,
        level="recommended",
        why="GTID sequence numbers then only grow within a domain, "
        "which following a failover by GTID relies on",
    ),
    _Setting(
        "log_slave_updates",
        "ON",
        "in my.cnf set log_slave_updates = ON, then restart the server",
        optional=True,
        level="recommended",
        why="a replica then writes what it replicates to its binlog: needed to read a replica, "
        "and for a failover to this server to go on by GTID",
    ),
)


def _binlog_settings(source: Source) -> list[Check]:
    found = source.variables(*(s.name for s in _SETTINGS))
    return [_setting_check(setting, found[setting.name]) for setting in _SETTINGS]


def _binlog_filters(source: Source) -> list[Check]:
    """Fails for a binlog filter (``binlog_do_db``, ``binlog_ignore_db``): the server then leaves
    out of its binlog a statement whose *default* database is filtered, whatever table it names
    (``USE other; TRUNCATE TABLE shop.t``), and the lake would silently keep the old rows."""
    try:  # SHOW MASTER STATUS, or SHOW BINARY LOG STATUS (MySQL 8.4): the same columns on both
        status = source.binlog_status()
    except pymysql.err.MySQLError as exc:  # no REPLICATION CLIENT: the privilege check fails it
        return [
            Check(
                "binlog filters",
                True,
                f"not checked: {source.dialect.binlog_status_sql} was refused ({exc.args[-1]})",
            )
        ]
    checks, shows = [], source.dialect.binlog_status_sql
    for name in ("binlog_do_db", "binlog_ignore_db"):
        value = str(status.get(name) or "")
        if not value:
            checks.append(
                Check(name, True, f"{name}: not set" if status else f"{name}: the binlog is off")
            )
            continue
        checks.append(
            Check(
                name,
                False,
                f"{name} = {value}; Tidemark needs every statement in the binlog: the server "
                "leaves out a statement issued from a filtered default database (USE other; "
                "TRUNCATE TABLE db.t), whatever table it changes, and the lake would keep the old "
                "rows",
                f"remove every {name} ({name.replace('_', '-')}) line from my.cnf and restart the "
                f"server ({shows} then shows {name} empty)",
            )
        )
    return checks


def _setting_check(setting: _Setting, value: str | None) -> Check:
    name = setting.name
    if value is None and setting.optional:
        return Check(name, True, f"{name}: not on this server version; skipped")
    if (value or "").upper() == setting.wanted:
        return Check(name, True, f"{name} = {value}")
    match setting.level:
        case "info":
            return Check(name, True, f"{name} = {value} ({setting.why})")
        case "recommended":
            return Check(
                name,
                True,
                f"{name} = {value}; {setting.wanted} is recommended: {setting.why} ({setting.fix})",
            )
        case "required":
            return Check(
                name, False, f"{name} = {value}; Tidemark needs {setting.wanted}", setting.fix
            )


def _duration(seconds: float) -> str:
    """Short human form of a duration.

    >>> _duration(3600), _duration(90), _duration(2 * 86400 + 3 * 3600)
    ('1h', '1m30s', '2d3h')
    """
    left = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def _retention(source: Source, expected_hours: float) -> Check:
    found = source.variables("binlog_expire_logs_seconds", "expire_logs_days")
    seconds = float(found["binlog_expire_logs_seconds"] or 0)
    days = float(found["expire_logs_days"] or 0)
    has_seconds = found["binlog_expire_logs_seconds"] is not None
    if seconds > 0:
        retention, setting = seconds, f"binlog_expire_logs_seconds = {int(seconds)}"
    elif days > 0:
        retention, setting = days * 86400, f"expire_logs_days = {days:g}"
    else:
        name = "binlog_expire_logs_seconds" if has_seconds else "expire_logs_days"
        return Check(
            "binlog retention",
            True,
            f"{name} = 0: binlogs are kept until purged by hand, nothing expires mid-run",
        )
    needed = expected_hours * 3600
    if retention >= needed:
        return Check(
            "binlog retention",
            True,
            f"binlogs expire after {_duration(retention)} ({setting}); "
            f"a run is expected to take {_duration(needed)}",
        )
    suggest = max(math.ceil(2 * needed / 3600) * 3600, 86400)
    if has_seconds:
        fix = (
            f"SET GLOBAL binlog_expire_logs_seconds = {suggest} and in my.cnf: "
            f"binlog_expire_logs_seconds = {suggest}"
        )
    else:
        fix = (
            f"SET GLOBAL expire_logs_days = {math.ceil(suggest / 86400)} and in my.cnf: "
            f"expire_logs_days = {math.ceil(suggest / 86400)}"
        )
    return Check(
        "binlog retention",
        False,
        f"binlogs expire after {_duration(retention)} ({setting}), shorter than a run is "
        f"expected to take ({_duration(needed)}, defaults.expected_run_hours); the binlog a "
        "run needs could be purged before it is read",
        f"{fix}; or lower defaults.expected_run_hours if runs are shorter",
    )


def _server_id(source: Source, replica_id: int) -> Check:
    own = source.variables("server_id")["server_id"]
    if own is not None and int(own) == replica_id:
        return Check(
            "server_id",
            False,
            f"source.server_id {replica_id} is the server's own server_id; "
            "the server refuses a binlog reader with its own id",
            "set source.server_id to a number no server or replica in the topology uses",
        )
    return Check("server_id", True, f"source.server_id {replica_id} (the server's is {own})")


# --------------------------------------------------------------------------- tables


def _table_checks(
    source: Source, table: TableConfig, index: int, info: TableInfo | None, pattern: bool
) -> list[Check]:
    return [
        replace(c, tables=(table.name,))
        for c in _one_table_checks(source, table, index, info, pattern)
    ]


def _one_table_checks(
    source: Source, table: TableConfig, index: int, info: TableInfo | None, pattern: bool
) -> list[Check]:
    if info is None:
        return [
            Check(
                f"table {table.name}",
                False,
                f"table {table.name} does not exist on {source.address} "
                f"(as seen by user `{source.config.user}`)",
                f"check tables[{index}].name, and that the user has SELECT on the table",
            )
        ]
    elsewhere = unkept(info)
    if elsewhere is not None:
        return [
            Check(
                f"table {table.name}",
                False,
                f"{table.name} is {elsewhere}; no run could keep it equal to the source",
                (_exclude_fix(table, index) if pattern else "leave it out of the pipeline")
                + " (docs/limits.md says what to keep instead)",
            )
        ]
    return [
        Check(
            f"table {table.name}",
            True,
            f"{len(info.columns)} columns, about {info.row_estimate} rows, engine {info.engine}"
            + versioned.note(info),
        ),
        chunk_key_check(
            table,
            index,
            info,
            pattern=pattern,
            time_zone=source.config.time_zone,
            snapshot=lambda: how_to_snapshot(source, lock_allowed=table.keyless_lock),
        ),
        _types(info, index, pattern, source),
        _column_names(info, index, pattern),
    ]


def _cols(key: Iterable[str]) -> str:
    return "(" + ", ".join(key) + ")"


def chunk_key_check(
    table: TableConfig,
    index: int,
    info: TableInfo,
    *,
    pattern: bool = False,
    time_zone: str = "+00:00",
    snapshot: Callable[[], SnapshotMethod] | None = None,
) -> Check:
    """The table's chunk key, chosen by the planner's own rule (`choose_chunk_key`); for a table
    without a key, that it is published as the multiset of its rows, and how the source lets
    it be read at one position.

    Args:
        table: the table's config.
        index: the place in the config's ``tables`` list of the entry configuring it, to name the
            setting.
        info: the table as the source describes it.
        pattern: the entry is a pattern: the fix is an entry of the table's own, or an exclude.
        time_zone: ``source.time_zone``.
        snapshot: how the source reads a table without a key (`how_to_snapshot`), asked only
            for such a table.
    """
    name = f"chunk key {table.name}"
    setting = f"tables[{index}].chunk_key"
    try:
        key = choose_chunk_key(table, info, time_zone)
    except ConfigError as exc:
        fix = (
            f"give {table.name} an entry of its own with a chunk_key, or add it to "
            f"tables[{index}].exclude"
            if pattern
            else f"{'change' if table.chunk_key else 'set'} {setting}"
        )
        return Check(name, False, str(exc), fix)
    except SourceNotReady as exc:
        return Check(name, False, str(exc), _exclude_fix(table, index) if pattern else "")
    if not key:
        how = KEYLESS_READS[snapshot() if snapshot is not None else "snapshot"]
        return Check(name, True, f"{keyless.reason(info)}; {how}")
    if table.chunk_key is None:
        return Check(name, True, f"primary key {_cols(key)}")
    return Check(name, True, f"{_cols(key)} from {setting}, a unique NOT NULL key")


#: How a table without a key is read at one position, by `SnapshotMethod`.
KEYLESS_READS: dict[SnapshotMethod, str] = {
    "snapshot": "the source gives a consistent snapshot's binlog position: read in one, no lock",
    "quiet": (
        "the source gives no snapshot position (MySQL): read in a consistent snapshot once the "
        "binlog shows no change of it in a short window, tried until source.read_timeout "
        "(keyless_lock: true allows a brief read lock instead; it needs the LOCK TABLES grant)"
    ),
    "lock": (
        "the source gives no snapshot position (MySQL): read in a consistent snapshot begun "
        "under a brief LOCK TABLES ... READ (keyless_lock; it needs the LOCK TABLES grant)"
    ),
}


def _exclude_fix(table: TableConfig, index: int) -> str:
    return f"add {table.name} to tables[{index}].exclude to leave it out of the pattern"


def _types(info: TableInfo, index: int, pattern: bool, source: Source) -> Check:
    problems = []
    for column in info.columns:
        try:
            arrow_type(column)
        except UnsupportedType as exc:
            problems.append(str(exc).split(";")[0])
    # text in a non-Unicode set: how the server reads it, asked now (once a process)
    unreadable = charsets.load(source, charsets.used_by([info]))
    problems += [
        f"column `{c.name}`: {unreadable[c.charset.lower()].split(';')[0]}"
        for c in info.columns
        if c.charset and c.charset.lower() in unreadable
    ]
    if problems:
        fix = (
            f"add {info.name} to tables[{index}].exclude"
            if pattern
            else "leave the table out of the pipeline"
        )
        return Check(
            f"types {info.name}",
            False,
            f"{info.name}: " + "; ".join(problems),
            f"{fix}, or change the column to a mappable type",
        )
    spatial = [
        f"`{c.name}` ({'no SRID declared' if c.srid is None else f'SRID {c.srid}'})"
        for c in info.columns
        if c.data_type in SPATIAL_TYPES
    ]
    return Check(
        f"types {info.name}",
        True,
        f"all {len(info.columns)} column types map to Arrow"
        + (f"; published as OGC WKB: {', '.join(spatial)}" if spatial else ""),
    )


def _column_names(info: TableInfo, index: int, pattern: bool) -> Check:
    """Fails for a column named like Tidemark's own change columns (`changes.reserved_columns`),
    which the run refuses to plan."""
    problem = reserved_columns(info)
    if problem is None:
        return Check(f"column names {info.name}", True, f"none starts with {RESERVED_PREFIX}")
    return Check(
        f"column names {info.name}",
        False,
        problem,
        f"add {info.name} to tables[{index}].exclude to leave it out of the pattern"
        if pattern
        else "",
    )
