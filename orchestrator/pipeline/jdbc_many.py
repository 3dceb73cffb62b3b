"""One Spark job for many small tables of one shape: a job's fixed cost paid once, not per table.

A batch of small tables (`orchestrator.pipeline.batches`) would run one Spark job per table,
and a job of a table of a hundred rows is nearly all fixed cost: the schema query, planning,
scheduling, the output's commit. Tables of one *shape* - the same columns (names, types,
charsets, collations, nullability, in order), the same chunk key and the same data file schema
(field IDs) - are read by one job instead: its derived table is the ``UNION ALL`` of each
table's derived table (`read_sql.source_query`), each branch tagged with the table's number, and
partition ``i`` reads ``<tag> = t AND (<chunk predicate>)``. The server pushes that condition
into the branches (MariaDB's ``condition_pushdown_for_derived``, MySQL 8's derived condition
pushdown): the other branches are an impossible WHERE, so each partition reads its own chunk
through its own table's index, exactly as a job of that table alone would. The column reads
and conversions are the same expressions (`read_sql.column_sql`), so the files are the same.

Tables are grouped only on a server that pushes the condition down (`Dialect.pushes_into_unions`;
elsewhere every branch would be materialized for each partition), and only tables estimated at
most `GROUP_ROWS` rows, `GROUP_TABLES` at most per job: a server whose optimizer declines to push
it down pays a bounded price. A group whose job fails for any reason but a lost connection
is read again table by table, so a table's own failure stays its own (`pipeline.failed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from chunking.mysql import quote_identifier
from orchestrator.config import PipelineConfig
from orchestrator.lake import storage
from orchestrator.pipeline.jdbc import ColumnRead, batch_frame, write_chunks
from orchestrator.pipeline.read_sql import column_aliases, table_select
from orchestrator.runtime.spark import apply_required_conf, job_description
from orchestrator.schema.tables import TableInfo

log = logging.getLogger(__name__)

#: Tables read by one job at most.
GROUP_TABLES = 64
#: A table estimated above this many rows is read by a job of its own.
GROUP_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class TableRead:
    """One table's part of a group: its columns, its chunks and where each one goes."""

    info: TableInfo
    chunks: Sequence[tuple[int, str, str]]  # (chunk index, SQL predicate, staging directory)


def shape(info: TableInfo, key: Sequence[str], schema: pa.Schema) -> tuple[object, ...] | None:
    """What tables read by one job share; None for a table read by a job of its own (too big)."""
    if info.row_estimate > GROUP_ROWS:
        return None
    fields = tuple((f.name, str(f.type), f.nullable, tuple(sorted((f.metadata or {}).items()))) for f in schema)
    return (tuple(info.columns), tuple(key), fields)


def groups(shapes: dict[str, tuple[object, ...] | None]) -> list[list[str]]:
    """Tables of one shape, `GROUP_TABLES` at most a group, in the order given; a table alone
    in its shape (or too big: None) is a group of one.

    >>> groups({"a": ("x",), "b": None, "c": ("x",), "d": ("y",)})
    [['a', 'c'], ['d'], ['b']]
    """
    by_shape: dict[object, list[list[str]]] = {}
    alone: list[list[str]] = []
    for table, found in shapes.items():
        if found is None:
            alone.append([table])
            continue
        members = by_shape.setdefault(found, [[]])
        if len(members[-1]) == GROUP_TABLES:
            members.append([])
        members[-1].append(table)
    return [g for found in by_shape.values() for g in found] + alone


def tag_alias(aliases: Sequence[str]) -> str:
    """The name of the branch tag column: the aliases' prefix (no column's name starts with it,
    `read_sql.column_aliases`) and ``table``, never one of the aliases.

    >>> tag_alias(["__tm_0", "__tm_1"]), tag_alias(["___tm_0"])
    ('__tm_table', '___tm_table')
    """
    return aliases[0].rsplit("_", 1)[0] + "_table" if aliases else "__tm_table"


def union_source(tables: Sequence[TableInfo], tag: str) -> Callable[[Sequence[str], Sequence[ColumnRead]], str]:
    """The derived table of a group: each table's `read_sql.source_query` tagged with its number."""
    def source(aliases: Sequence[str], reads: Sequence[ColumnRead]) -> str:
        branches = []
        for number, table in enumerate(tables):
            select = table_select(table, aliases, [r.sql for r in reads]).removeprefix("SELECT ")
            branches.append(f"SELECT {number} AS {quote_identifier(tag)}, {select}")
        return "(" + " UNION ALL ".join(branches) + ") AS tm_src"
    return source


def read_group(spark: SparkSession, config: PipelineConfig, tables: Sequence[TableRead], key: Sequence[str],
               schema: pa.Schema, guard: Callable[[], None]) -> list[list[tuple[int, int]]]:
    """Read every chunk of ``tables`` (one shape) in one Spark job; ``(rows, bytes)`` per chunk,
    per table. Raises as `jdbc.read_chunks` does, naming the group's first and last table."""
    apply_required_conf(spark)
    first = tables[0].chunks[0][2]
    attempt_dir = storage.join(storage.parent(first), f"_tmp-group-{storage.attempt_tag()}")
    guard()
    label = f"{len(tables)} tables {tables[0].info.name} .. {tables[-1].info.name}"
    job_description(spark, f"tidemark read {label}")
    infos = [t.info for t in tables]
    columns = infos[0].columns
    targets = [(index, out_dir) for t in tables for index, _, out_dir in t.chunks]

    def frame() -> DataFrame:
        tag = tag_alias(column_aliases(columns))
        predicates = [f"{quote_identifier(tag)} = {number} AND ({where})"
                      for number, t in enumerate(tables) for _, where, _ in t.chunks]
        names = F.array(*[F.lit(i.name) for i in infos])

        def null_message(column: str) -> Column:
            return F.concat(F.lit("table "), F.element_at(names, F.col(tag) + 1),
                            F.lit(f": NULL read from NOT NULL column {column}"))

        return batch_frame(spark, config, infos[0], predicates, schema, source=union_source(infos, tag),
                           null_message=null_message)

    placed = write_chunks(config, frame, [infos[0].column(k).name for k in key], attempt_dir, label, targets,
                          schema, guard)
    log.info("read %s in one job: %d chunks, %d rows", label, len(targets), sum(rows for rows, _ in placed))
    out, at = [], 0
    for t in tables:
        out.append(placed[at:at + len(t.chunks)])
        at += len(t.chunks)
    return out
