"""``tidemark plan``: the chunk plans of the chosen tables, printed as a table or as the JSON
document docs/cli.md describes, without reading any row (`orchestrator.pipeline.plan.chunks`
plans each table)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from chunking import TablePlan, chunk_predicate, encode_key
from chunking.keys import decode_key, short
from orchestrator.app.cascade_checks import describe, plan_cascades
from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import ConfigError, SourceNotReady, TidemarkError
from orchestrator.pipeline import keyless
from orchestrator.pipeline.plan.chunks import check_escaping, key_columns, plan_table, read_by
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.schema.cascades import ForeignKey
from orchestrator.schema.tables import TableInfo
from orchestrator.source.connection import Source
from orchestrator.source.listing import table_set, tables_info


def plan_document(items: Sequence[tuple[TableConfig, TableInfo, TablePlan]]) -> dict[str, Any]:
    """The ``tidemark plan --json`` document (docs/cli.md).

    Every chunk carries ``where`` (the SQL predicate, with the table's filter
    ANDed in), ``start`` and ``end`` (encoded keys, null when unbounded) and
    ``end_inclusive`` (true only for the last chunk, which ends at the max key).
    """
    tables = []
    for table_config, info, plan in items:
        columns = key_columns(info, plan.chunk_key)
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
                "reason": plan.stats.get("reason"),
                "chunks": chunks,
            }
        )
    return {"tables": tables}


def render_plans(plans: Sequence[TablePlan]) -> str:
    """The human table: strategy, who reads it, chunk count, rows, key and key range per table.

    >>> from chunking import TablePlan
    >>> stats = {"rows": 5, "rows_exact": True, "min": [1, "x"], "max": [9, "y"]}
    >>> print(render_plans([TablePlan("s.t", "uneven", ("a", "b"), (), stats)]))
    table  strategy  read by  chunks  rows  chunk key  key range
    s.t    uneven    none          0     5  a, b       (1, 'x') .. (9, 'y')
    """
    header = ("table", "strategy", "read by", "chunks", "rows", "chunk key", "key range")
    lines = [header]
    for plan in plans:
        s = plan.stats
        rows = f"{'' if s.get('rows_exact') else '~'}{s.get('rows', 0)}"
        if plan.strategy == keyless.STRATEGY:
            key_range = "(no key: rows as a multiset)"
        elif s.get("min") is None:
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
    query runs. A table a pattern matched that cannot be planned (a unique key to choose, a type
    that cannot be chunked) fails alone: the others are planned and printed, it is listed with
    its reason, and the exit code is 3. A table without a key is planned (strategy ``keyless``),
    and a line after the plans says why.
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
        planned = [table.name for table, _, _ in items]
        cascades = plan_cascades(config, source, planned)
    if as_json:
        document = plan_document(items)
        document["patterns"] = [m.to_json() for m in found.patterns]
        document["failed"] = [{"table": name, "reason": why} for name, why in failed.items()]
        document["cascades"] = cascades
        print(json.dumps(document, indent=2))
    else:
        for match in found.patterns:
            print(f"pattern {match}")
        print(render_plans([plan for _, _, plan in items]))
        for _, _, plan in items:
            if plan.strategy == keyless.STRATEGY:
                print(plan.stats["reason"])
        for name, why in failed.items():
            print(f"not planned: {name}: {why}")
        for key in cascades["keys"]:
            print(f"cascade {describe(ForeignKey.from_json(key), {t.lower() for t in planned})}")
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
