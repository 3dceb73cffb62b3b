"""One table's chunk plan.

`plan_table` plans one table (the chunk math lives in `chunking`; the key choice
in `orchestrator.pipeline.plan.keys`) and logs the decision with its numbers; `read_by` says
who reads it. ``tidemark plan`` prints these plans (`orchestrator.app.plan`). Planning reads
only key bounds and index walks, never row data, and never prints connection settings.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from chunking import Chunk, ChunkingError, KeyRange, TablePlan, plan_key_space
from chunking.keys import decode_key, short
from chunking.mysql import SESSION_SQL_MODE, SQL_MODE_QUERY, Query, backslash_escapes_off
from orchestrator.config import Defaults, TableConfig
from orchestrator.errors import SourceNotReady
from orchestrator.pipeline import keyless
from orchestrator.pipeline.changes import reserved_columns
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.pipeline.read.local import reads_locally
from orchestrator.schema.tables import ColumnInfo, TableInfo

log = logging.getLogger("tidemark.planning")


def check_escaping(query: Query) -> None:
    """Refuse a session whose ``sql_mode`` would read the plan's escaped literals literally.

    Tidemark's sessions set `SESSION_SQL_MODE`; this catches one where that did not hold (a
    proxy that drops session settings)."""
    rows = query(SQL_MODE_QUERY)
    mode = str(rows[0][0]) if rows else ""
    if backslash_escapes_off(mode):
        raise SourceNotReady(
            f"the session's sql_mode {mode!r} includes NO_BACKSLASH_ESCAPES although Tidemark "
            f"set it to {SESSION_SQL_MODE!r}, so chunk predicates' string literals would read "
            "differently; connect to the server directly, not through a proxy that drops "
            "session settings"
        )


def key_columns(info: TableInfo, key: Sequence[str]) -> list[ColumnInfo]:
    return [info.column(name) for name in key]


def plan_table(
    query: Query,
    table_config: TableConfig,
    table_info: TableInfo,
    defaults: Defaults,
    *,
    check_mode: bool = True,
    time_zone: str = "+00:00",
) -> TablePlan:
    """Plan one table's chunks and log the decision with its numbers.

    Args:
        query: runs SQL text on the source (``Source.query`` fits).
        table_config: the table's config (chunk size, chunk key).
        table_info: the table's schema and row estimate.
        defaults: the pipeline defaults (the even strategy's distribution factor bounds).
        check_mode: check the source's ``sql_mode`` (`check_escaping`) first; off when the
            caller checked it once for many tables.
        time_zone: ``source.time_zone`` (see `choose_chunk_key`).

    Raises:
        ConfigError, SourceNotReady: see `choose_chunk_key` and `check_escaping`; SourceNotReady
            too for a column named like Tidemark's own (`changes.reserved_columns`).
    """
    if (reserved := reserved_columns(table_info)) is not None:  # a column added since preflight
        raise SourceNotReady(reserved)
    key = choose_chunk_key(table_config, table_info, time_zone)
    if check_mode:
        check_escaping(query)
    if not key:
        plan = keyless_plan(table_info, table_config.chunk_size)
        log.info("%s", keyless.reason(table_info))
        return plan
    try:
        plan = plan_key_space(
            query,
            table_info.name,
            key,
            key_columns(table_info, key),
            table_config.chunk_size,
            row_estimate=table_info.row_estimate,
            factor_bounds=defaults.even_distribution_factor,
        )
    except ChunkingError as exc:
        raise SourceNotReady(str(exc)) from exc
    log.info("%s", describe_decision(plan))
    return plan


def keyless_plan(table_info: TableInfo, chunk_size: int) -> TablePlan:
    """The plan of a table without a key: one chunk, the whole table, read by the driver at one
    position (`orchestrator.pipeline.read.keyless`); no query.

    >>> p = keyless_plan(TableInfo("s", "log", (), (), (), 42), 1000)
    >>> p.strategy, p.chunk_key, len(p.chunks), p.stats["rows"], read_by(p)
    ('keyless', (), 1, 42, 'driver')
    """
    rows = table_info.row_estimate
    return TablePlan(
        table_info.name,
        keyless.STRATEGY,
        (),
        (Chunk(0, KeyRange.all(), rows),),
        {
            "rows": rows,
            "rows_exact": False,
            "chunk_size": chunk_size,
            "chunks": 1,
            "queries": 0,
            "reason": keyless.reason(table_info),
        },
    )


def describe_decision(plan: TablePlan) -> str:
    """The plan's log line: strategy and the numbers it was chosen on.

    >>> from chunking import TablePlan
    >>> stats = {"min": [1], "max": [9000000], "rows": 2800000, "rows_exact": False,
    ...          "factor": 3.2, "chunks": 56, "queries": 2, "reason": "factor within bounds"}
    >>> print(describe_decision(TablePlan("shop.orders", "even", ("id",), (), stats)))
    table shop.orders: strategy even, min 1, max 9000000, approx rows 2800000, distribution \
factor 3.2, 56 chunks, 2 queries (factor within bounds)
    """
    s = plan.stats
    rows = f"{'rows' if s.get('rows_exact') else 'approx rows'} {s.get('rows')}"
    factor = f"{s['factor']:.4g}" if s.get("factor") is not None else "n/a"
    return (
        f"table {plan.table}: strategy {plan.strategy}, min {short(decode_key(s.get('min')))}, "
        f"max {short(decode_key(s.get('max')))}, {rows}, distribution factor {factor}, "
        f"{s.get('chunks', len(plan.chunks))} chunks, {s.get('queries')} queries "
        f"({s.get('reason')})"
    )


#: Who reads a planned table's chunks: the driver (`orchestrator.pipeline.read.local`), Spark, or
#: nobody (an empty table: no chunk).
ReadBy = Literal["driver", "spark", "none"]


def read_by(plan: TablePlan) -> ReadBy:
    """Who reads ``plan``'s chunks (as `orchestrator.pipeline.read.step` decides).

    >>> from chunking import Chunk, KeyRange, TablePlan
    >>> read_by(TablePlan("s.t", "even", ("id",), (Chunk(0, KeyRange.all(), 5),), {"rows": 5}))
    'driver'
    >>> read_by(TablePlan("s.e", "empty", ("id",), (), {"rows": 0}))
    'none'
    """
    if plan.strategy == keyless.STRATEGY:
        return "driver"
    if not plan.chunks:
        return "none"
    return "driver" if reads_locally(plan.stats.get("rows"), len(plan.chunks)) else "spark"
