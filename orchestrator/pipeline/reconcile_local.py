"""The incremental rewrite in the driver, with pyarrow: `orchestrator.pipeline.reconcile`'s rule, same output.

`orchestrator.pipeline.reconcile.reconcile_incremental` runs this instead of Spark when
the rewrite reads little (`orchestrator.pipeline.reconcile.LOCAL_REWRITE_BYTES`) and every
key column is NOT NULL of a type pyarrow orders as Spark does (`local_rewrite_allowed`):
a fresh JVM's start and warm-up cost far more than the rewrite of a small change set.
Each function mirrors its Spark twin in `orchestrator.pipeline.reconcile`: `_local_last_events`
is ``last_events(events(...))``, `_local_slots` is `assign_slots`, and the merge is
``_merge`` (base rows without a last event, plus the puts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import FileRange, Territory
from orchestrator.pipeline.changes import DELETE, KIND, OLD_PREFIX, OP, POSITION, PUT, event_key
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import staging_schema


def _locally_orderable(t: pa.DataType) -> bool:
    """Staging types pyarrow orders as Spark does: numbers by value, text and binary bytewise.
    Floats are left to Spark (NaN and -0.0 compare differently)."""
    return bool(pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_string(t)
                or pa.types.is_binary(t) or pa.types.is_boolean(t) or pa.types.is_date32(t)
                or pa.types.is_timestamp(t))


def local_rewrite_allowed(table_info: TableInfo, key: Sequence[str]) -> bool:
    """Whether `rewrite_locally` orders this key exactly as Spark does: NOT NULL key columns
    of types pyarrow and Spark order alike."""
    fields = staging_schema(table_info.columns)
    return all(not fields.field(k).nullable and _locally_orderable(fields.field(k).type) for k in key)


def rewrite_locally(table_info: TableInfo, key: Sequence[str], table_dir: str, ranges: Sequence[FileRange],
                    segments: Sequence[str], out_dir: str, slot: str, limit: int | None) -> list[int] | None:
    """`_rewrite_with_spark` in the driver, with pyarrow: the same rule, the same output.

    Returns the rewritten slots, or None (nothing written) when the base files to
    read exceed ``limit`` bytes.
    """
    schema = staging_schema(table_info.columns)
    merge = pa.schema([*(f.with_nullable(True) for f in schema), pa.field("_tm_src", pa.int8()),
                       pa.field(slot, pa.int32())])
    last = _local_last_events(pa.concat_tables([_read(u) for u in segments], promote_options="default"),
                              table_info, key)
    slot_of = _local_slots([last.column(event_key(i)) for i in range(len(key))], table_info, key,
                           layout.territories(ranges))
    slots = sorted(set(slot_of.to_pylist()))
    files = [s for s in slots if 0 <= s < len(ranges)]
    if limit is not None and sum(ranges[s]["bytes"] for s in files) > limit:
        return None
    parts = []
    for s in files:  # base rows (_tm_src 0) of the rewritten files
        base = _read(storage.join(table_dir, ranges[s]["file"]), schema.names)
        parts.append(pa.table([*(_staging_array(base.column(f.name)) for f in schema),
                               _constant(0, base.num_rows, pa.int8()), _constant(s, base.num_rows, pa.int32())],
                              schema=merge))
    # the last event of each changed key: 1 puts its row, 2 deletes the key
    names = [c.name for c in table_info.columns]
    kind = pc.if_else(pc.equal(last.column(KIND), PUT), 1, 2).cast(pa.int8())
    rows = [last.column(event_key(key.index(n))) if n in key else last.column(n) for n in names]
    parts.append(pa.table([*rows, kind, slot_of], names=merge.names).cast(merge))
    merged = pa.concat_tables(parts).sort_by([*[(k, "ascending") for k in key], ("_tm_src", "ascending")])
    merged = merged.filter(_last_of_each_key(merged, key))
    merged = merged.filter(pc.not_equal(merged.column("_tm_src"), 2))
    for s in slots:
        part = merged.filter(pc.equal(merged.column(slot), s)).select(names)
        if part.num_rows:
            fs, path = storage.filesystem(storage.join(out_dir, f"{slot}={s}", "part-00000.parquet"))
            fs.create_dir(storage.parent(path), recursive=True)
            with fs.open_output_stream(path) as out:
                pq.write_table(part.cast(schema), out, compression="snappy")
    return slots


def _constant(value: Any, length: int, type_: pa.DataType) -> pa.Array:
    return pc.fill_null(pa.nulls(length, type_), pa.scalar(value, type_))


def _read(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    fs, path = storage.filesystem(uri)
    with fs.open_input_file(path) as handle:
        return pq.read_table(handle, columns=list(columns) if columns is not None else None)


def _staging_array(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A published column in its staging type (TIME: duration -> int64 micros)."""
    return column.cast(pa.int64()) if pa.types.is_duration(column.type) else column


def _last_of_each_key(table: pa.Table, key: Sequence[str]) -> pa.Array:
    """True on the last row of each run of equal keys of a table sorted by key (keys NOT NULL)."""
    if table.num_rows == 0:
        return pa.array([], pa.bool_())
    differs: Any = None
    for k in key:
        column = table.column(k).combine_chunks()
        step = pc.not_equal(column.slice(0, len(column) - 1), column.slice(1))
        differs = step if differs is None else pc.or_(differs, step)
    return pa.concat_arrays([differs, pa.array([True], pa.bool_())])


def _local_last_events(changes: pa.Table, table_info: TableInfo, key: Sequence[str]) -> pa.Table:
    """`last_events(events(...))` in pyarrow: ``_tm_k<i>``, position, kind and row columns."""
    names = [c.name for c in table_info.columns]
    keys = [event_key(i) for i in range(len(key))]
    op = changes.column(OP)

    def event(rows: pa.Table, key_columns: Sequence[str], kind: int) -> pa.Table:
        columns = [*(rows.column(k) for k in key_columns), *(rows.column(p) for p in POSITION),
                   _constant(kind, rows.num_rows, pa.int8())]
        columns += [rows.column(n) if kind == PUT else pa.nulls(rows.num_rows, rows.schema.field(n).type)
                    for n in names]
        return pa.table(columns, names=[*keys, *POSITION, KIND, *names])

    updates = changes.filter(pc.is_in(op, pa.array(["U", "D"])))  # a D may carry an old key too
    moved: Any = pa.array([False] * updates.num_rows, pa.bool_())
    for k in key:
        moved = pc.or_(moved, pc.not_equal(updates.column(OLD_PREFIX + k), updates.column(k)))
    evts = pa.concat_tables([
        event(changes.filter(pc.is_in(op, pa.array(["I", "U"]))), key, PUT),
        event(changes.filter(pc.equal(op, "D")), key, DELETE),
        event(updates.filter(moved), [OLD_PREFIX + k for k in key], DELETE),
    ])
    ordered = evts.sort_by([(k, "ascending") for k in [*keys, *POSITION, KIND]])
    return ordered.filter(_last_of_each_key(ordered, keys))


def _local_slots(keys: Sequence[pa.ChunkedArray], table_info: TableInfo, key: Sequence[str],
                 territories: Sequence[Territory]) -> pa.Array:
    """The slot of each key (`assign_slots` in pyarrow); every key must land in exactly one."""
    columns = [table_info.column(k) for k in key]
    n = len(keys[0]) if keys else 0
    slot = pa.array([0] * n, pa.int64())
    hits = pa.array([0] * n, pa.int64())
    for t in territories:
        inside = pa.array([True] * n, pa.bool_())
        if t.low is not None:
            low = layout.staging_key(columns, t.low)
            inside = pc.and_(inside, _key_before(keys, low, after=True, or_equal=t.low_inclusive))
        if t.high is not None:
            high = layout.staging_key(columns, t.high)
            inside = pc.and_(inside, _key_before(keys, high, after=False, or_equal=t.high_inclusive))
        hit = inside.cast(pa.int64())
        hits = pc.add(hits, hit)
        slot = pc.add(slot, pc.multiply(hit, t.slot))
    if n and pc.min_max(hits).as_py() != {"min": 1, "max": 1}:
        raise RunFailed(f"internal: a changed key of {table_info.name} fell in no file range or in two; "
                        "re-snapshot the table with tidemark run --snapshot")
    return slot.cast(pa.int32())


def _key_before(keys: Sequence[pa.ChunkedArray], bound: tuple[Any, ...], *, after: bool, or_equal: bool
                ) -> pa.ChunkedArray:
    """Each key sorts before ``bound`` (``after``: ``bound`` sorts before the key), or equals it
    where ``or_equal``; lexicographic, as `_before` (no NULLs: `local_rewrite_allowed`)."""
    result: Any = pa.array([or_equal] * len(keys[0]), pa.bool_())
    for column, value in reversed(list(zip(keys, bound, strict=True))):
        scalar = pa.scalar(value, type=column.type)
        less = pc.greater(column, scalar) if after else pc.less(column, scalar)
        result = pc.or_(less, pc.and_(pc.equal(column, scalar), result))
    return result
