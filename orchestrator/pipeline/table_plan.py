"""One table's chunk plan, and ``tidemark plan``.

`plan_table` plans one table (the chunk math lives in `chunking`; the key choice
in `orchestrator.schema.keys`) and logs the decision with its numbers;
`plan_command` is ``tidemark plan``. Planning reads only key bounds and index
walks, never row data, and never prints connection settings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Literal

from chunking import ChunkingError, TablePlan, chunk_predicate, encode_key, plan_key_space
from chunking.keys import decode_key, short
from chunking.mysql import SESSION_SQL_MODE, SQL_MODE_QUERY, Query, backslash_escapes_off
from orchestrator.config import Defaults, PipelineConfig, TableConfig
from orchestrator.errors import ConfigError, SourceNotReady, TidemarkError
from orchestrator.pipeline.changes import reserved_columns
from orchestrator.pipeline.local_read import reads_locally
from orchestrator.schema.keys import choose_chunk_key
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.source.connection import Source
from orchestrator.source.listing import table_set, tables_info

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


def _key_columns(info: TableInfo, key: Sequence[str]) -> list[ColumnInfo]:
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
    try:
        plan = plan_key_space(
            query,
            table_info.name,
            key,
            _key_columns(table_info, key),
            table_config.chunk_size,
            row_estimate=table_info.row_estimate,
            factor_bounds=defaults.even_distribution_factor,
        )
    except ChunkingError as exc:
        raise SourceNotReady(str(exc)) from exc
    log.info("%s", describe_decision(plan))
    return plan


def describe_decision(plan: TablePlan) -> str:
    """The plan's log line: strategy and the numbers it was chosen on.

    >>> from chunking import TablePlan
    >>> print(describe_decision(TablePlan("shop.orders", "even", ("id",), (), {
    ...     "min": [1], "max": [9000000], "rows": 2800000, "rows_exact": False, "factor": 3.2,
    ...     "chunks": 56, "queries": 2, "reason": "distribution factor 3.2 is within [0.05, 100.0]"})))
    table shop.orders: strategy even, min 1, max 9000000, approx rows 2800000, distribution factor 3.2, \
56 chunks, 2 queries (distribution factor 3.2 is within [0.05, 100.0])
    """
    s = plan.stats
    rows = f"{'rows' if s.get('rows_exact') else 'approx rows'} {s.get('rows')}"
    factor = f"{s['factor']:.4g}" if s.get("factor") is not None else "n/a"
    return (
        f"table {plan.table}: strategy {plan.strategy}, min {short(decode_key(s.get('min')))}, "
        f"max {short(decode_key(s.get('max')))}, {rows}, distribution factor {factor}, "
        f"{s.get('chunks', len(plan.chunks))} chunks, {s.get('queries')} queries ({s.get('reason')})"
    )


#: Who reads a planned table's chunks: the driver (`orchestrator.pipeline.local_read`), Spark, or
#: nobody (an empty table: no chunk).
ReadBy = Literal["driver", "spark", "none"]


def read_by(plan: TablePlan) -> ReadBy:
    """Who reads ``plan``'s chunks (as `orchestrator.pipeline.read` decides).

    >>> from chunking import Chunk, KeyRange, TablePlan
    >>> read_by(TablePlan("s.t", "even", ("id",), (Chunk(0, KeyRange.all(), 5),), {"rows": 5}))
    'driver'
    >>> read_by(TablePlan("s.e", "empty", ("id",), (), {"rows": 0}))
    'none'
    """
    if not plan.chunks:
        return "none"
    return "driver" if reads_locally(plan.stats.get("rows"), len(plan.chunks)) else "spark"


def plan_document(items: Sequence[tuple[TableConfig, TableInfo, TablePlan]]) -> dict[str, Any]:
    """The ``tidemark plan --json`` document (CONTRACT.md).

    Every chunk carries ``where`` (the SQL predicate, with the table's filter
    ANDed in), ``start`` and ``end`` (encoded keys, null when unbounded) and
    ``end_inclusive`` (true only for the last chunk, which ends at the max key).
    """
    tables = []
    for table_config, info, plan in items:
        columns = _key_columns(info, plan.chunk_key)
        chunks = [
            {
                "index": c.index,
                "where": chunk_predicate(plan.chunk_key, c.range, columns, table_config.where),
                "start": encode_key(c.range.start),
                "end": encode_key(c.range.end),
                "end_inclusive": c.range.end_inclusive,
            }
            for c in plan.chunks
        ]
        tables.append(
            {
                "table": plan.table,
                "strategy": plan.strategy,
                "read_by": read_by(plan),
                "chunk_key": list(plan.chunk_key),
                "chunks": chunks,
            }
        )
    return {"tables": tables}


def render_plans(plans: Sequence[TablePlan]) -> str:
    """The human table: strategy, who reads it, chunk count, rows, key and key range per table.

    >>> from chunking import TablePlan
    >>> print(render_plans([TablePlan("s.t", "uneven", ("a", "b"), (), {"rows": 5, "rows_exact": True,
    ...       "min": [1, "x"], "max": [9, "y"]})]))
    table  strategy  read by  chunks  rows  chunk key  key range
    s.t    uneven    none          0     5  a, b       (1, 'x') .. (9, 'y')
    """
    header = ("table", "strategy", "read by", "chunks", "rows", "chunk key", "key range")
    lines = [header]
    for plan in plans:
        s = plan.stats
        rows = f"{'' if s.get('rows_exact') else '~'}{s.get('rows', 0)}"
        if s.get("min") is None:
            key_range = "(empty)"
        else:
            key_range = f"{short(decode_key(s['min']), 40)} .. {short(decode_key(s['max']), 40)}"
        lines.append(
            (
                plan.table,
                plan.strategy,
                read_by(plan),
                str(len(plan.chunks)),
                rows,
                ", ".join(plan.chunk_key),
                key_range,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {3, 4}
    out = []
    for line in lines:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def plan_command(config: PipelineConfig, tables: list[str], as_json: bool) -> int:
    """``tidemark plan``: plan the chosen tables (all when none named; a pattern entry names all it
    matches) and print the plans, with what each pattern matched.

    The key problems of explicitly configured tables are reported together before any planning
    query runs. A table a pattern matched that cannot be planned (no usable key, a type that
    cannot be chunked) fails alone: the others are planned and printed, it is listed with its
    reason, and the exit code is 3.
    """
    with Source.from_pipeline(config) as source:
        found = table_set(config, source)
        selected = found.select(tables)
        shapes = tables_info(source, [t.name for t in selected])
        infos = [shapes.get(t.name) or source.table_info(t.name) for t in selected]
        from_pattern = {
            t.name for t in selected if config.tables[found.entry_index(t.name)].pattern
        }
        _check_keys(
            [(t, i) for t, i in zip(selected, infos, strict=True) if t.name not in from_pattern],
            config.source.time_zone,
        )
        check_escaping(source.query)
        items, failed = [], {}
        for t, info in zip(selected, infos, strict=True):
            try:
                items.append(
                    (
                        t,
                        info,
                        plan_table(
                            source.query,
                            t,
                            info,
                            config.defaults,
                            check_mode=False,
                            time_zone=config.source.time_zone,
                        ),
                    )
                )
            except (ConfigError, SourceNotReady) as exc:
                if t.name not in from_pattern:
                    raise
                failed[t.name] = str(exc)
    if as_json:
        document = plan_document(items)
        document["patterns"] = [m.to_json() for m in found.patterns]
        document["failed"] = [{"table": name, "reason": why} for name, why in failed.items()]
        print(json.dumps(document, indent=2))
    else:
        for match in found.patterns:
            print(f"pattern {match}")
        print(render_plans([plan for _, _, plan in items]))
        for name, why in failed.items():
            print(f"not planned: {name}: {why}")
    return SourceNotReady.exit_code if failed else 0


def _check_keys(tables: Sequence[tuple[TableConfig, TableInfo]], time_zone: str) -> None:
    problems: list[TidemarkError] = []
    for table_config, info in tables:
        try:
            choose_chunk_key(table_config, info, time_zone)
        except (ConfigError, SourceNotReady) as exc:
            problems.append(exc)
    if not problems:
        return
    lines = [line for p in problems for line in str(p).splitlines()]
    if any(isinstance(p, SourceNotReady) for p in problems):
        raise SourceNotReady("\n".join(lines))
    raise ConfigError(lines)
