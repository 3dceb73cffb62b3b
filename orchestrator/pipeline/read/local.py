"""Small tables read by the driver: the Spark read's SQL through PyMySQL, its files written by
pyarrow.

A table of a hundred rows read by Spark is nearly all fixed cost: a Spark task (a JDBC
connection and statement, a Parquet writer, a task commit: about 50 ms), and a run of small
tables only pays the JVM's start too (seconds). The driver reads a table planned at most
`LOCAL_ROWS` rows itself, exactly as Spark would have:

- the same statement: the derived table and per-column expressions of
  `orchestrator.pipeline.read.sql`, the chunk's predicate, so the server hands over the same
  values (integers for temporal values, DOUBLE for FLOAT, text for CHAR/ENUM/SET and wide
  DECIMAL: nothing a client library formats or rounds);
- each `orchestrator.pipeline.read.sql.Wire` kind becomes the column's published type as Spark's
  cast does (`wire_array`: epoch days to date32, epoch microseconds to timestamps, 0/1 to boolean);
- a NULL in a NOT NULL column fails the table, naming the column, as the Spark job does;
- the rows sorted in the files' order (`orchestrator.lake.order`: Spark's order of the
  published values), written with the data file schema (field IDs, required columns) as one
  file per chunk, straight in the run's ``snapshot/`` directory (`read._ChunkPaths.file_of`):
  a Spark job writes a directory of part files per chunk, the driver needs none (two
  directories a small table fewer to create, and to delete at the end of the run).

So reconcile and publish cannot tell a driver-written chunk file from a Spark-written one
(tests/integration/test_local_read.py compares them value for value, every type of the mapping). One
thing more comes of a driver's read: each file's `layout.FileRange` (first and last key, rows,
bytes), known as it is written, which the read step records with the chunk so that reconcile need
not open the file again to learn it (a tenth of a small table's run). The read happens between the
batch's ``L`` and ``Hb`` like any other (`orchestrator.pipeline.read.step`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pymysql

from chunking.mysql import quote_identifier
from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, SourceNotReady, TransientReadError
from orchestrator.lake.layout import FileRange
from orchestrator.lake.order import sort_keys
from orchestrator.lake.writer import key_at, write_table
from orchestrator.pipeline.read.sql import Wire, column_aliases, column_sql, source_query
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import spatial_wkb, staging_type
from orchestrator.source.connection import Source
from orchestrator.source.retry import is_connection_lost

log = logging.getLogger(__name__)

#: A table planned at most this many rows, in one chunk, is read by the driver. Measured side by
#: side with a Spark job on a warm JVM (bench/bench_local_read.py, shop.orders' 10 columns, load
#: 4.4): 100 rows 5.7 vs 763 ms, 10,000 rows 140 vs 541 ms, 30,000 rows 254 vs 526 ms, 100,000
#: rows 927 vs 671 ms: the driver is faster up to about 65,000 rows even when the JVM is running
#: anyway, and a run of such tables only starts none.
LOCAL_ROWS = 50_000

#: Rows converted at a time: the driver holds one such batch as Python values, the rest as Arrow.
BATCH_ROWS = 10_000

#: Source connections reading small tables at once: while one waits for the server, the other
#: converts and writes (pyarrow works outside the GIL).
LOCAL_CONNECTIONS = 2

#: What a table read by the driver gives: its file's `FileRange` per chunk, or why it failed.
Outcome = list[FileRange] | Exception


def reads_locally(planned_rows: int | None, chunks: int) -> bool:
    """Whether a table of ``chunks`` chunks planned at ``planned_rows`` rows is read by the driver.

    >>> (reads_locally(100, 1), reads_locally(100, 2), reads_locally(None, 1),
    ...  reads_locally(LOCAL_ROWS + 1, 1))
    (True, False, False, False)
    """
    return chunks == 1 and planned_rows is not None and planned_rows <= LOCAL_ROWS


@dataclass(frozen=True, slots=True)
class LocalTable:
    """One table the driver reads: its columns, key, data file schema, and chunks."""

    info: TableInfo
    key: Sequence[str]
    schema: pa.Schema  # the data file schema (`iceberg.data_file_schema`)
    chunks: Sequence[tuple[int, str, str]]  # (chunk index, SQL predicate, the chunk's file)


def read_tables(
    config: PipelineConfig, tables: Sequence[LocalTable], guard: Callable[[], None]
) -> dict[str, Outcome]:
    """Every chunk of ``tables``, `LOCAL_CONNECTIONS` tables at a time; per table the file each
    chunk's read wrote (`FileRange`), or the exception its read raised (the caller tells a table's
    own failure from the run's, as for a Spark job)."""
    if not tables:
        return {}
    workers = min(LOCAL_CONNECTIONS, len(tables))
    shares = [tables[i::workers] for i in range(workers)]
    with ThreadPoolExecutor(workers, thread_name_prefix="tidemark-local") as pool:
        futures = [pool.submit(_read_share, config, share, guard) for share in shares]
    out: dict[str, Outcome] = {}
    for future in futures:
        out.update(future.result())
    log.info(
        "read %d small table(s) in the driver: %d rows",
        len(tables),
        sum(f["rows"] for done in out.values() if not isinstance(done, Exception) for f in done),
    )
    return out


def _read_share(
    config: PipelineConfig, tables: Sequence[LocalTable], guard: Callable[[], None]
) -> dict[str, Outcome]:
    """``tables`` one after the other on one source connection."""
    out: dict[str, Outcome] = {}
    with Source.from_pipeline(config, known_good=True) as source:
        for table in tables:
            try:
                out[table.info.name] = read_table(source, table, guard)
            except Exception as exc:
                out[table.info.name] = exc
    return out


def read_table(source: Source, table: LocalTable, guard: Callable[[], None]) -> list[FileRange]:
    """Read ``table``'s chunks, each into its file; the `FileRange` of each.

    Raises:
        TransientReadError: the connection was lost (the batch is read again).
        RunFailed: the read failed for this table (an SQL error, a NULL in a NOT NULL column).
    """
    info = table.info
    key = [info.column(k).name for k in table.key]
    out: list[FileRange] = []
    for index, where, target in table.chunks:
        label = f"{info.name} chunk {index}"
        parts = list(read_rows(source, info, table.schema, where, label))
        data = pa.concat_tables(parts) if parts else table.schema.empty_table()
        data = (
            data.take(pc.sort_indices(data, sort_keys=sort_keys(key)))
            if data.num_rows > 1
            else data
        )
        guard()
        nbytes = write_table(target, data)
        first, last = (
            (key_at(data, key, 0), key_at(data, key, -1)) if data.num_rows else (None, None)
        )
        out.append(
            FileRange(file=target, min_key=first, max_key=last, rows=data.num_rows, bytes=nbytes)
        )
    return out


def read_rows(
    source: Source, info: TableInfo, schema: pa.Schema, where: str, label: str
) -> Iterator[pa.Table]:
    """The rows of ``SELECT ... WHERE <where>`` on ``source``'s connection, `BATCH_ROWS` at a
    time, as tables of ``schema`` (the data file schema: field IDs, required columns).

    Raises:
        TransientReadError: the connection was lost.
        RunFailed: an SQL error, a value that cannot be converted, a NULL in a NOT NULL column.
    """
    exprs = [column_sql(c) for c in info.columns]
    aliases = column_aliases(info.columns)
    select = ", ".join(quote_identifier(a) for a in aliases)
    derived = source_query(info, aliases, [e.sql for e in exprs])
    wires = [e.wire for e in exprs]
    for rows in _batches(source, f"SELECT {select} FROM {derived} WHERE {where}", label):
        data = _convert(rows, info.columns, wires, schema, label)
        missing = [
            f.name
            for f, column in zip(schema, data.columns, strict=True)
            if not f.nullable and column.null_count
        ]
        if missing:
            raise RunFailed(f"table {info.name}: NULL read from NOT NULL column {missing[0]}")
        yield _as_schema(data, schema)


def _batches(source: Source, sql: str, label: str) -> Iterator[list[tuple[Any, ...]]]:
    """The chunk's rows, `BATCH_ROWS` at a time; a lost connection is a `TransientReadError`
    (the batch is read again), an SQL error the table's own."""
    try:
        yield from source.batches(sql, BATCH_ROWS)
    except (
        SourceNotReady
    ) as exc:  # lost: the read step's retry reads the batch again, with a fresh L
        raise TransientReadError(f"read of {label} failed: {exc}") from exc
    except pymysql.err.MySQLError as exc:
        if is_connection_lost(exc):
            raise TransientReadError(f"read of {label} failed: {exc}") from exc
        raise RunFailed(f"read of {label} failed: {exc}") from exc


def _convert(
    rows: Sequence[Sequence[Any]],
    columns: Sequence[ColumnInfo],
    wires: Sequence[Wire],
    schema: pa.Schema,
    label: str,
) -> pa.Table:
    """`chunk_table`, a value it cannot convert failing the table."""
    try:
        return chunk_table(rows, columns, wires, schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        raise RunFailed(f"read of {label} failed: {exc}") from exc


def chunk_table(
    rows: Sequence[Sequence[Any]],
    columns: Sequence[ColumnInfo],
    wires: Sequence[Wire],
    schema: pa.Schema,
) -> pa.Table:
    """The rows PyMySQL returned for the converted columns as a table of ``schema``'s types, every
    field nullable (the caller checks the required ones hold no NULL, then casts to ``schema``)."""
    arrays = [
        _typed(wire_array([r[i] for r in rows], wire, column), field.type)
        for i, (column, wire, field) in enumerate(zip(columns, wires, schema, strict=True))
    ]
    loose = pa.schema(f.with_nullable(True) for f in schema)
    return pa.Table.from_arrays(arrays, schema=loose)


def _typed(array: pa.Array, wanted: pa.DataType) -> pa.Array:
    """``array`` cast to ``wanted`` when it is of another type (a cast to its own type is a
    no-op whose call alone took half the conversion of a small table's rows)."""
    return array if array.type == wanted else array.cast(wanted)


def _as_schema(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as ``schema`` (its field IDs and required columns): the same columns when their
    types are the schema's, else cast."""
    if all(column.type == field.type for column, field in zip(data.columns, schema, strict=True)):
        return pa.Table.from_arrays(data.columns, schema=schema)
    return data.cast(schema)


def wire_array(values: Sequence[Any], wire: Wire, column: ColumnInfo) -> pa.Array:
    """The values of one converted column as Arrow, in the type Spark gives that wire kind
    (`orchestrator.pipeline.read.jdbc.column_read`).

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> wire_array([0, 18000, None], "epoch_days", C("d", "date", "date", True)).to_pylist()
    [datetime.date(1970, 1, 1), datetime.date(2019, 4, 14), None]
    >>> wire_array([1, 0], "boolean", C("b", "tinyint", "tinyint(1)", True)).to_pylist()
    [True, False]
    """
    match wire:
        case "boolean":
            return pa.array(values, pa.int64()).cast(pa.bool_())
        case "year":
            return pa.array(values, pa.int16())
        case "bits" | "time_micros":
            return pa.array(values, pa.int64())
        case "text":
            return pa.array(values, pa.string())
        case "double":
            return pa.array(values, pa.float64())
        case "epoch_days":  # integers become these types as they are: no cast (its call costs more
            return pa.array(values, pa.date32())  # than the conversion, for a small table's rows)
        case "wall_micros":
            return pa.array(values, pa.timestamp("us"))
        case "instant_micros":
            return pa.array(values, pa.timestamp("us", "UTC"))
        case "spatial":
            wkb = spatial_wkb(column)
            return pa.array([None if v is None else wkb(v) for v in values], pa.binary())
        case "as_is":
            return pa.array(values, staging_type(column))
