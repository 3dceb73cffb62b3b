"""The rewrite engine in the driver: pyarrow, file by file, with
`orchestrator.pipeline.reconcile.rewrite`'s rule.

The changes of a table become its *last events* (`last_events`: per key, the last change by
position; a put carries the after-image, a delete none; a key-changing update or a ``D`` made by
the table's filter also deletes its old key), sorted by key in the files' order
(`orchestrator.lake.order`). Each event falls in one slot of the base files (`slot_spans`, a
binary search per file boundary). A rewritten slot's new rows are its base file's rows merged
with its events (`merged`): the base file is read record batch by record batch, each batch
takes the events up to its last key, and the merge drops base rows whose key has an event and
adds the puts, in key order. Memory holds the events and one batch per file being written, never
a whole file; `orchestrator.lake.writer.write_parts` runs files in parallel on the cores.

It is the Spark engine's twin (`orchestrator.pipeline.reconcile.spark`): `last_events` is
``last_events(events(...))``, `slot_spans` is ``assign_slots``, `merged` is ``_merge`` of one
slot. Both write the same files (tests/integration/test_incremental.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from orchestrator.lake import layout, storage
from orchestrator.lake.layout import FileRange
from orchestrator.lake.order import bisect, same_as_next, sort_keys
from orchestrator.lake.writer import read_published, to_published
from orchestrator.pipeline.changes import DELETE, KIND, OLD_PREFIX, OP, POSITION, PUT, event_key
from orchestrator.pipeline.segments import taken
from orchestrator.schema.tables import ColumnInfo, TableInfo

_SRC, _ROW, _AT = "_tm_src", "_tm_rowid", "_tm_at"


def read_changes(segments: Sequence[str]) -> pa.Table | None:
    """The change segments of a table as one Arrow table (None: no segment); a segment this
    process wrote and kept (`orchestrator.pipeline.segments.keep`) is taken from memory when its
    file is there with the same schema."""
    tables = []
    for uri in segments:
        fs, path = storage.filesystem(uri)
        kept = taken(path)
        if kept is not None and kept.schema.equals(pq.read_schema(path, filesystem=fs)):
            tables.append(kept)
            continue
        with fs.open_input_file(path) as handle:
            tables.append(pq.ParquetFile(handle).read())
    return pa.concat_tables(tables, promote_options="default") if tables else None


def _constant(value: Any, length: int, type_: pa.DataType) -> pa.Array:
    return pc.fill_null(pa.nulls(length, type_), pa.scalar(value, type_))


def _differs(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Element-wise ``a`` and ``b`` differ, NULL equal to NULL (Spark's ``NOT (a <=> b)``)."""
    equal = pc.or_kleene(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    return pc.invert(equal)


def last_events(changes: pa.Table, table_info: TableInfo, key: Sequence[str]) -> pa.Table:
    """The last event of each key, sorted by key: ``_tm_k<i>``, position, kind and row columns.

    'I'/'U' put the after-image under the new key; 'D' deletes the key of its image; a 'U' or
    'D' whose old key differs also deletes the old key (a 'D' made of an update that left the
    table's filter: `orchestrator.pipeline.capture.filtering`). At one position a put wins.
    """
    names = [c.name for c in table_info.columns]
    keys = [event_key(i) for i in range(len(key))]
    op = changes.column(OP)
    # Events are built, sorted and chosen narrow (key, position, kind, the change's row); only the
    # last ones take their row columns from the changes, once: a put its after-image, a delete
    # nulls (a null row index). Filtering and concatenating whole rows cost twice as much.
    at = pa.array(np.arange(changes.num_rows, dtype=np.int64))
    narrow = changes.select([*key, *(OLD_PREFIX + k for k in key), *POSITION, OP]).append_column(
        _AT, at
    )

    def event(rows: pa.Table, key_columns: Sequence[str], kind: int) -> pa.Table:
        columns = [
            *(rows.column(k) for k in key_columns),
            *(rows.column(p) for p in POSITION),
            _constant(kind, rows.num_rows, pa.int8()),
            rows.column(_AT),
        ]
        return pa.table(columns, names=[*keys, *POSITION, KIND, _AT])

    updates = narrow.filter(pc.is_in(op, pa.array(["U", "D"])))
    moved: Any = _constant(False, updates.num_rows, pa.bool_())
    for k in key:
        moved = pc.or_(moved, _differs(updates.column(OLD_PREFIX + k), updates.column(k)))
    events = pa.concat_tables(
        [
            event(narrow.filter(pc.is_in(op, pa.array(["I", "U"]))), key, PUT),
            event(narrow.filter(pc.equal(op, "D")), key, DELETE),
            event(updates.filter(moved), [OLD_PREFIX + k for k in key], DELETE),
        ]
    )
    order = pc.sort_indices(events, sort_keys=sort_keys([*keys, *POSITION, KIND]))
    ordered_keys = [events.column(k).take(order) for k in keys]
    last = events.take(order.filter(pc.invert(same_as_next(ordered_keys)))).combine_chunks()
    puts = pc.equal(last.column(KIND), PUT)
    rows = changes.select(names).take(
        pc.if_else(puts, last.column(_AT), pa.scalar(None, pa.int64()))
    )
    return pa.Table.from_arrays(
        [*(last.column(c) for c in [*keys, *POSITION, KIND]), *rows.columns],
        names=[*keys, *POSITION, KIND, *names],
    ).combine_chunks()


def event_keys(events: pa.Table, count: int) -> list[pa.ChunkedArray]:
    return [events.column(event_key(i)) for i in range(count)]


def slot_spans(
    events: pa.Table, columns: Sequence[ColumnInfo], ranges: Sequence[FileRange]
) -> dict[int, tuple[int, int]]:
    """``{slot: (start, end)}``: the events (sorted by key) each slot of the base files owns
    (`orchestrator.lake.layout`, "Territories"), for the slots that own any.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> ev = pa.table({"_tm_k0": [1, 5, 9, 12, 13]})
    >>> r = lambda lo, hi: {"file": "f", "min_key": [lo], "max_key": [hi], "rows": 1, "bytes": 1}
    >>> slot_spans(ev, [C("id", "int", "int", False)], [r(5, 8), r(9, 12)])
    {-1: (0, 1), 0: (1, 2), 1: (2, 4), 2: (4, 5)}
    >>> slot_spans(ev, [C("id", "int", "int", False)], [])
    {0: (0, 5)}
    """
    keys = event_keys(events, len(columns))
    total = events.num_rows
    if not ranges:
        return {0: (0, total)} if total else {}
    edges = [0]
    for entry in ranges:
        assert entry["min_key"] is not None, "usable ranges hold rows"
        edges.append(bisect(keys, layout.staging_key(columns, entry["min_key"]), lo=edges[-1]))
    last = ranges[-1]["max_key"]
    assert last is not None
    edges.append(bisect(keys, layout.staging_key(columns, last), right=True, lo=edges[-1]))
    edges.append(total)
    return {
        slot: (a, b)
        for slot, (a, b) in zip(
            range(layout.HEAD_SLOT, len(ranges) + 1), itertools.pairwise(edges), strict=True
        )
        if b > a
    }


def _puts(events: pa.Table, schema: pa.Schema) -> pa.Table:
    """The after-images of the put events, in ``schema``."""
    rows = events.filter(pc.equal(events.column(KIND), PUT)).select(schema.names)
    return pa.Table.from_batches(
        [to_published(b, schema) for b in rows.to_batches()], schema=schema
    )


def merged(
    base_uri: str, events: pa.Table, schema: pa.Schema, key: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """The rows of a rewritten slot in key order: the base file's rows (``base_uri``; empty:
    none) without those whose key has an event, plus the puts among ``events`` (the slot's
    last events, sorted by key)."""
    keys = event_keys(events, len(key))
    done = 0
    if base_uri:
        for batch in read_published(base_uri, schema):
            if not batch.num_rows:
                continue
            last = tuple(batch.column(k)[batch.num_rows - 1].as_py() for k in key)
            upto = bisect(keys, last, right=True, lo=done)
            if upto == done:
                yield batch
                continue
            yield _merge_batch(batch, events.slice(done, upto - done), schema, key)
            done = upto
    yield from _puts(events.slice(done), schema).to_batches()


def _interleave(
    base: Sequence[pa.Array | pa.ChunkedArray], events: pa.Table, rows: pa.Array | None = None
) -> tuple[pa.Table, pa.Array]:
    """Base keys and event keys sorted together in the files' order, a base row before an event
    of the same key (a stable sort): the sorted keys (with ``_tm_rowid`` from ``rows`` when given:
    base rows first, then events) and, per sorted row, whether it is a base row whose key has an
    event (it is replaced or deleted)."""
    n, m = len(base[0]), events.num_rows
    columns = {
        f"k{i}": pa.chunked_array([*_chunks(b), *_chunks(events.column(event_key(i)).cast(b.type))])
        for i, b in enumerate(base)
    }
    names = list(columns)
    columns[_SRC] = pa.chunked_array([_constant(0, n, pa.int8()), _constant(1, m, pa.int8())])
    if rows is not None:
        columns[_ROW] = rows
    both = pa.table(columns)
    ordered = both.take(pc.sort_indices(both, sort_keys=sort_keys(names, _SRC)))
    src = ordered.column(_SRC).combine_chunks()
    next_is_event = pa.concat_arrays([src.slice(1), pa.array([0], pa.int8())])
    replaced = pc.and_(
        pc.and_(pc.equal(src, 0), pc.equal(next_is_event, 1)),
        same_as_next([ordered.column(c) for c in names]),
    )
    return ordered, replaced


def _chunks(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(array.chunks) if isinstance(array, pa.ChunkedArray) else [array]


def _integer_key(
    base: Sequence[pa.Array | pa.ChunkedArray], events: pa.Table
) -> tuple[Any, Any] | None:
    """A key of one integer column without NULLs, base and events as numpy arrays (the files'
    order is the numbers' order); None for any other key (`_interleave` sorts it). A DECIMAL of
    scale 0 (a BIGINT UNSIGNED is published as DECIMAL(20, 0)) counts as an integer when every
    value fits in int64, or else in uint64."""
    if len(base) != 1 or base[0].null_count:
        return None
    kind = base[0].type
    ours = events.column(event_key(0))
    if ours.null_count:
        return None
    if pa.types.is_integer(kind):
        return base[0].to_numpy(), ours.cast(kind).to_numpy()
    if not pa.types.is_decimal(kind) or kind.scale != 0:
        return None
    for number in (pa.int64(), pa.uint64()):
        try:
            return base[0].cast(number).to_numpy(), ours.cast(number).to_numpy()
        except pa.ArrowInvalid:  # a value out of its range
            continue
    return None


def _replaced(base: Any, ours: Any) -> tuple[Any, Any]:
    """Where each event's key goes among the sorted base keys, and whether a base row has it."""
    at = np.searchsorted(base, ours, side="left")
    hit = np.zeros(len(ours), dtype=bool)
    inside = at < len(base)
    hit[inside] = base[at[inside]] == ours[inside]
    return at, hit


def _merge_batch(
    batch: pa.RecordBatch, events: pa.Table, schema: pa.Schema, key: Sequence[str]
) -> pa.RecordBatch:
    """One sorted base batch with the events of its key range: base rows whose key has an event
    go, the puts come in, in key order."""
    n = batch.num_rows
    is_put = pc.equal(events.column(KIND), PUT)
    numeric = _integer_key([batch.column(k) for k in key], events)
    if numeric is not None:  # a binary search per event instead of sorting the batch with them
        at, hit = _replaced(*numeric)
        keep = np.ones(n, dtype=bool)
        keep[at[hit]] = False
        puts = is_put.to_numpy(zero_copy_only=False)
        # each put goes where its key is among the kept rows: its place among the base rows
        # less the rows dropped before it (``at`` ascends with the events' keys)
        dropped_before = np.searchsorted(at[hit], at[puts], side="left")
        taken: Any = np.insert(
            np.flatnonzero(keep),
            at[puts] - dropped_before,
            n + np.arange(int(puts.sum()), dtype=np.int64),
        )
    else:
        taken = _taken(batch, events, is_put, key)
    # one copy per column: the base batch and the puts as one array, then the rows taken from it
    # (a table's take of two chunks copies them into one first, and its result was copied again)
    rows = pa.array(taken, pa.int64())
    puts_table = _puts(events, schema)
    return pa.RecordBatch.from_arrays(
        [
            pa.concat_arrays([batch.column(i), *puts_table.column(i).chunks]).take(rows)
            for i in range(len(schema))
        ],
        schema=schema,
    )


def _taken(batch: pa.RecordBatch, events: pa.Table, is_put: Any, key: Sequence[str]) -> pa.Array:
    """`_merge_batch`'s rows to take (base rows, then puts), by sorting base and event keys
    together."""
    n = batch.num_rows
    put_rank = pc.subtract(pc.cumulative_sum(is_put.cast(pa.int64())), 1)
    rows = pa.chunked_array(
        [
            pc.subtract(pc.cumulative_sum(_constant(1, n, pa.int64())), 1),
            pc.if_else(is_put, pc.add(put_rank, n), -1),
        ]
    )  # -1: a delete, no row
    ordered, replaced = _interleave([batch.column(k) for k in key], events, rows)
    ids = ordered.column(_ROW)
    return ids.filter(pc.and_(pc.invert(replaced), pc.greater_equal(ids, 0)))


def output_rows(base_uri: str, base_rows: int, events: pa.Table, key: Sequence[str]) -> int:
    """The exact row count of a rewritten slot (its base file's rows, less those whose key has an
    event, plus the puts), from the key columns alone."""
    puts = pc.sum(pc.equal(events.column(KIND), PUT).cast(pa.int64())).as_py() or 0
    if not base_uri or not events.num_rows:
        return base_rows + puts
    with storage.open_parquet(base_uri) as handle:  # one file: no dataset (0.5 ms a table)
        base = pq.ParquetFile(handle).read(columns=list(key))
    numeric = _integer_key([base.column(k) for k in key], events)
    if numeric is not None:
        return base_rows - int(_replaced(*numeric)[1].sum()) + puts
    _, replaced = _interleave([base.column(k) for k in key], events)
    return base_rows - (pc.sum(replaced.cast(pa.int64())).as_py() or 0) + puts
