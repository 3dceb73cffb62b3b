"""The source's tables in bulk: which tables a pipeline's patterns match, and many tables' shapes.

A pipeline of thousands of tables must not ask ``information_schema`` three questions per
table: `table_set` lists the base tables once (one query) and expands the config's patterns
over them (`orchestrator.config.patterns.expand`); `tables_info` reads the shape of many tables
with three queries in all, the same `TableInfo` that `Source.table_info` gives one table.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.config.patterns import SYSTEM_SCHEMAS, TableSet, expand, explicit_set, is_glob
from orchestrator.config.sections import lake_safe
from orchestrator.errors import SourceNotReady
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import PERIOD_BY_TIME, ROWS_ELSEWHERE, VERSIONED, TableInfo
from orchestrator.source.connection import Source, shaped

log = logging.getLogger("tidemark.planning")

#: Below this many tables, `tables_info` asks per table (its queries name the table exactly).
BULK_FROM = 20
#: Names per ``IN (...)`` list of one query.
IN_LIST = 1000

#: Base tables, MariaDB's system-versioned ones among them, whose engine keeps their rows where
#: the binlog logs them (`ROWS_ELSEWHERE`: not a MERGE, FEDERATED or BLACKHOLE table...).
_TABLES_SQL = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES"
    f" WHERE TABLE_TYPE IN ('BASE TABLE', '{VERSIONED}')"
    " AND (ENGINE IS NULL OR UPPER(ENGINE) NOT IN ("
    + ", ".join(f"'{engine}'" for engine in sorted(ROWS_ELSEWHERE))
    + "))"
)


def folds_names(source: Source) -> bool:
    """Whether the server compares table names without case (``lower_case_table_names`` 1 or 2)."""
    value = source.variables("lower_case_table_names")["lower_case_table_names"]
    return value not in (None, "0")


#: The tables `base_tables` left out for their names, said once a process.
_left_out: set[str] = set()


def base_tables(source: Source, entries: Sequence[TableConfig]) -> list[str]:
    """``database.table`` of every base table the pattern entries could match (one query: the
    databases they name, or every database but the server's own when a glob is in the database
    part), but a system-versioned table whose periods are transaction ids (one query each
    versioned table: docs/config.md, "Table patterns")."""
    rows = _base_tables(source, {t.name.partition(".")[0] for t in entries if t.pattern}, "")
    unsafe = [f"{_text(d)}.{_text(t)}" for d, t, _ in rows if not lake_safe(_text(d), _text(t))]
    if set(unsafe) - _left_out:  # once a process (a run lists them at preflight and planning)
        _left_out.update(unsafe)
        log.warning(
            "patterns leave out %s: a name `.`, `..` or with `/` cannot be a directory of the "
            "lake; rename the table at the source",
            ", ".join(f"`{n}`" for n in unsafe),
        )
    return [
        f"{_text(schema)}.{_text(name)}"
        for schema, name, kind in rows
        if lake_safe(_text(schema), _text(name))
        and (_text(kind) != VERSIONED or _by_time(source.period_end(_text(schema), _text(name))))
    ]


def _by_time(period_end: tuple[str, str] | None) -> bool:
    """Whether a system-versioned table's periods are times, not transaction ids: a table
    versioned by transaction ids is logged as statements (`orchestrator.binlog.versioned`), each
    change re-reading it, so a pattern does not take it."""
    return period_end is None or period_end[1] == PERIOD_BY_TIME


def table_rows(source: Source, entries: Sequence[TableConfig]) -> dict[str, int]:
    """The server's row estimate (``TABLE_ROWS``) of every base table in the databases the
    entries name (one query, as `base_tables`), by ``database.table``."""
    rows = _base_tables(source, {t.name.partition(".")[0] for t in entries}, ", TABLE_ROWS")
    return {
        f"{_text(schema)}.{_text(name)}": int(estimate or 0) for schema, name, _, estimate in rows
    }


def _base_tables(source: Source, databases: set[str], more: str) -> list[tuple[Any, ...]]:
    """``TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE`` (and the ``more`` columns) of the base tables in
    ``databases`` (every database but the server's own when one is a glob)."""
    sql = _TABLES_SQL.replace("TABLE_TYPE FROM", f"TABLE_TYPE{more} FROM")
    if any(is_glob(d) for d in databases):
        marks = ", ".join(["%s"] * len(SYSTEM_SCHEMAS))
        return source.query(f"{sql} AND TABLE_SCHEMA NOT IN ({marks})", sorted(SYSTEM_SCHEMAS))
    if databases:
        marks = ", ".join(["%s"] * len(databases))
        return source.query(f"{sql} AND TABLE_SCHEMA IN ({marks})", sorted(databases))
    return []


def table_set(config: PipelineConfig, source: Source) -> TableSet:
    """The pipeline's tables now: explicit entries as they are, patterns expanded over the source's
    base tables (a config without patterns asks nothing)."""
    if not config.has_patterns:
        return explicit_set(config.tables)
    found = expand(config.tables, base_tables(source, config.tables), fold=folds_names(source))
    for match in (
        found.patterns
    ):  # the plan step says it once a run (`orchestrator.pipeline.plan.step.find_tables`)
        log.debug("pattern %s", match)
    return found


# --------------------------------------------------------------------------- shapes in bulk

_BULK_TABLES = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS, ENGINE, TABLE_TYPE FROM information_schema.TABLES"
)
_BULK_COLUMNS = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE,"
    " NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, CHARACTER_SET_NAME, COLLATION_NAME"
    " FROM information_schema.COLUMNS"
)
_BULK_INDEXES = (
    "SELECT TABLE_SCHEMA, TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SUB_PART"
    " FROM information_schema.STATISTICS"
)


def tables_info(source: Source, names: Sequence[str]) -> dict[str, TableInfo]:
    """The shape of each table of ``names`` that exists (absent: the source has no such table, or
    the user cannot see it), keyed and named as asked; as `Source.table_info` would give it."""
    if len(names) < BULK_FROM:
        found = {}
        for name in names:
            with contextlib.suppress(SourceNotReady):  # absent: the caller says what is missing
                found[name] = source.table_info(name)
        return found
    tables = _grouped(source, _BULK_TABLES, "", names)
    columns = _grouped(
        source, _BULK_COLUMNS, " ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", names
    )
    indexes = _grouped(
        source, _BULK_INDEXES, " ORDER BY TABLE_SCHEMA, TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX", names
    )
    out: dict[str, TableInfo] = {}
    for name in names:
        key = _key_of(name, tables)
        if key is None:
            continue
        rows, engine, kind = tables[key][0]
        database, _, table = name.partition(".")
        out[name] = source.with_row_end(
            source.with_srids(
                shaped(
                    database, table, columns.get(key, []), indexes.get(key, []), rows, engine, kind
                )
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Shapes:
    """Tables' shapes read once the server was at ``position`` (`shapes_at`): a run whose ``P0``
    is that position or an earlier one may plan with them instead of reading them again, as
    `tidemark run` and a DAG's ``plan`` task plan with their preflight's."""

    position: BinlogPosition
    infos: Mapping[str, TableInfo]

    def pick(self, names: Sequence[str]) -> tuple[dict[str, TableInfo], list[str]]:
        """The shapes of ``names`` held here, and the names not held (to be read)."""
        held = {n: self.infos[n] for n in names if n in self.infos}
        return held, [n for n in names if n not in held]


def shapes_at(source: Source, names: Sequence[str]) -> Shapes:
    """The source's current position, then the shapes of ``names`` (`tables_info`), read after
    it: what a plan reads after recording ``P0``.

    Raises:
        SourceNotReady: the binlog is off.
    """
    position = source.current_position()
    return Shapes(position, MappingProxyType(tables_info(source, names)))


def _grouped(
    source: Source, sql: str, order: str, names: Sequence[str]
) -> dict[tuple[str, str], list[tuple[Any, ...]]]:
    """The rows of ``sql`` for the tables of ``names``, by (schema, table), the first two columns
    dropped; the databases and tables are asked with ``IN`` lists, the pairs filtered here."""
    wanted = {_pair(n) for n in names} | {_pair(n.lower()) for n in names}
    by_db: dict[str, list[str]] = {}
    for name in names:
        database, _, table = name.partition(".")
        by_db.setdefault(database, []).append(table)
    out: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for database, tables in by_db.items():
        for start in range(0, len(tables), IN_LIST):
            part = tables[start : start + IN_LIST]
            marks = ", ".join(["%s"] * len(part))
            query = f"{sql} WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({marks}){order}"
            for row in source.query(query, [database, *part]):
                pair = (_text(row[0]), _text(row[1]))
                if pair in wanted or (pair[0].lower(), pair[1].lower()) in wanted:
                    out.setdefault(pair, []).append(tuple(row[2:]))
    return out


def _key_of(
    name: str, tables: dict[tuple[str, str], list[tuple[Any, ...]]]
) -> tuple[str, str] | None:
    """The (schema, table) the server reported for ``name``: the same spelling, else the one table
    whose name differs only in case (a server comparing names without case)."""
    exact = _pair(name)
    if exact in tables:
        return exact
    folded = [key for key in tables if (key[0].lower(), key[1].lower()) == _pair(name.lower())]
    return folded[0] if len(folded) == 1 else None


def _pair(name: str) -> tuple[str, str]:
    database, _, table = name.partition(".")
    return database, table


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
