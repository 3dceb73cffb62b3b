"""How a version's data files cover the key space, so an incremental run rewrites only what changed.

The layout (CONTRACT.md "Output layout"; README "Output"):

- every data file holds the rows of one key range, sorted by key, and the files of
  a version, in manifest order, hold disjoint ranges in ascending key order;
- the manifest's ``file_ranges`` says, per file and in the order of ``files``, its
  first and last key (`chunking.encode_key` of the published values), rows and bytes;
- a version shares every file whose keys did not change with the previous one;
  files are never modified (copy-on-write per file).

*Which order.* Files are range-partitioned and sorted by Spark, so their order is
Spark's order of the staging values: numbers, decimals and temporal values by
value, binary strings bytewise, text by its UTF-8 bytes (code points, *not* the
column's collation), NULL first. Membership of a changed key is decided in that
same order, never by Python comparisons, so it holds for any collation: by Spark
with the ranges as data, or by pyarrow, whose order is the same for the key types
it is given (`orchestrator.pipeline.reconcile`). Key equality is value equality, as in the
reconcile (the binlog carries a key exactly as stored).

*Territories.* The ``n`` non-empty files of the base version cut the key space
into slots: slot ``-1`` below the first file's first key (new head file),
slot ``i`` from file ``i``'s first key up to file ``i + 1``'s first key (the
gap after a file belongs to it), the last file up to and including its last key,
and slot ``n`` above it (new tail file). A changed key (or the old key of a
key-changing update) belongs to exactly one slot; only slots with changes are
rewritten.

*Sizes* are published bytes. A whole table is cut into files of about
`TARGET_FILE_BYTES`. A rewritten file is cut into equal pieces once it would
exceed twice the target (its size estimated from the table's bytes per row); a
new small file (under `SMALL_FILE_BYTES`) is merged with an adjacent small file
(`group_parts`), so runs of tail inserts do not fragment the table.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq

from chunking import decode_key, encode_key
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.values import time_micros

#: Aim for data files of about this many bytes of Parquet (snapshot and rewrites alike).
TARGET_FILE_BYTES = 32 * 1024 * 1024
#: A file below this size is small: a new small file is merged with a small neighbour.
SMALL_FILE_BYTES = TARGET_FILE_BYTES // 4
DATA_DIR = "data"
#: Rows per record batch when converting or copying data files.
BATCH_ROWS = 65536
#: The hand-over from reconcile to publish, in the reconciled staging dir
#: (a name starting with ``_`` that `storage.list_files` leaves out).
PLAN_FILE = "_tidemark_rewrite.json"
HEAD_SLOT = -1


class FileRange(TypedDict):
    """One entry of the manifest's ``file_ranges``."""

    file: str
    min_key: list[Any] | None  # encode_key of the first key; None for an empty file
    max_key: list[Any] | None
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Territory:
    """The keys one slot owns: from ``low`` to ``high``; ``None`` is unbounded."""

    slot: int
    low: list[Any] | None
    low_inclusive: bool
    high: list[Any] | None
    high_inclusive: bool


@dataclass(frozen=True, slots=True)
class RewritePlan:
    """What an incremental reconcile wrote: the base version and the slots it rewrote.

    The staging dir holds ``<slot_column>=<slot>/part-*.parquet`` for every
    rewritten slot that still has rows; a rewritten slot without a directory is empty.
    """

    base_version: int
    slots: tuple[int, ...]
    slot_column: str


@dataclass(frozen=True, slots=True)
class Part:
    """A run of rows, in key order, that a new version consists of.

    ``shared`` is the base version's entry when the part is a base file kept as
    is; otherwise ``uri`` is a staging file the reconcile wrote (new rows).
    """

    uri: str
    rows: int
    bytes: int
    shared: FileRange | None = None

    @property
    def new(self) -> bool:
        return self.shared is None


# --------------------------------------------------------------------------- manifest ranges


def usable_ranges(files: Sequence[str], ranges: Sequence[FileRange] | None) -> list[FileRange] | None:
    """The base version's non-empty file ranges, or None when the manifest has none to trust.

    A manifest from before ``file_ranges`` existed (or one whose ranges do not
    match its files) makes the incremental run rewrite the whole table once.

    >>> r = lambda f, n: {"file": f, "min_key": [1] if n else None, "max_key": [2] if n else None,
    ...                   "rows": n, "bytes": 9}
    >>> [x["file"] for x in usable_ranges(["a", "b"], [r("a", 0), r("b", 5)])]
    ['b']
    >>> usable_ranges(["a"], None) is None, usable_ranges(["a", "b"], [r("b", 1)]) is None
    (True, True)
    """
    if ranges is None or [r["file"] for r in ranges] != list(files):
        return None
    return [r for r in ranges if r["rows"] > 0]


def territories(ranges: Sequence[FileRange]) -> list[Territory]:
    """The slots the base files cut the key space into (module docstring, "Territories").

    >>> [(t.slot, t.low, t.high) for t in territories([
    ...     {"file": "a", "min_key": [1], "max_key": [5], "rows": 5, "bytes": 1},
    ...     {"file": "b", "min_key": [9], "max_key": [12], "rows": 4, "bytes": 1}])]
    [(-1, None, [1]), (0, [1], [9]), (1, [9], [12]), (2, [12], None)]
    >>> [(t.slot, t.low, t.high) for t in territories([])]
    [(0, None, None)]
    """
    if not ranges:
        return [Territory(0, None, True, None, True)]
    out = [Territory(HEAD_SLOT, None, True, ranges[0]["min_key"], False)]
    for i, entry in enumerate(ranges):
        last = i == len(ranges) - 1
        high = entry["max_key"] if last else ranges[i + 1]["min_key"]
        out.append(Territory(i, entry["min_key"], True, high, last))
    out.append(Territory(len(ranges), ranges[-1]["max_key"], False, None, True))
    return out


def staging_key(columns: Sequence[ColumnInfo], encoded: list[Any]) -> tuple[Any, ...]:
    """A manifest key (published values, JSON-encoded) as staging values for Spark.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> staging_key([C("t", "time", "time", False), C("n", "int", "int", False)],
    ...             [{"timedelta": "-01:00:00.000000"}, 7])
    (-3600000000, 7)
    """
    values = decode_key(encoded)
    assert values is not None
    out = []
    for column, value in zip(columns, values, strict=True):
        if column.data_type == "time" and isinstance(value, timedelta):
            value = time_micros(value)
        out.append(value)
    return tuple(out)


# --------------------------------------------------------------------------- sizes


def piece_rows(rows: int, nbytes: int, target: int) -> int:
    """Rows per output file: all of them, unless the data exceeds twice the target.

    >>> piece_rows(1000, 50, 100), piece_rows(1000, 250, 100), piece_rows(0, 0, 100)
    (1000, 334, 0)
    """
    if nbytes <= 2 * target or rows == 0:
        return rows
    return math.ceil(rows / math.ceil(nbytes / target))


def group_parts(parts: Sequence[Part], small: int) -> list[list[int]]:
    """Indexes of adjacent parts to write as one file; every other part is one group.

    A new part smaller than ``small`` joins its small neighbours (a shared small
    file is rewritten into the merged one) while the group stays under ``small``;
    two shared files are never merged with each other, so a version without new
    small files rewrites nothing.

    >>> P = lambda b, new: Part("x", 1, b, None if new else {"file": "f", "min_key": None,
    ...                                                      "max_key": None, "rows": 1, "bytes": b})
    >>> group_parts([P(5, False), P(5, False), P(5, True), P(50, False)], small=20)
    [[0], [1, 2], [3]]
    >>> group_parts([P(5, True), P(5, True), P(15, True), P(5, False)], small=20)
    [[0, 1, 2], [3]]
    """
    groups: list[list[int]] = []
    for i, part in enumerate(parts):
        if groups:
            group = groups[-1]
            total = sum(parts[j].bytes for j in group)
            if part.bytes < small and total < small and (part.new or any(parts[j].new for j in group)):
                group.append(i)
                continue
        groups.append([i])
    return groups


# --------------------------------------------------------------------------- the reconcile -> publish hand-over


def write_plan(out_dir: str, plan: RewritePlan) -> None:
    body = {"base_version": plan.base_version, "slots": list(plan.slots), "slot_column": plan.slot_column}
    storage.write_atomic(storage.join(out_dir, PLAN_FILE), (json.dumps(body) + "\n").encode())


def read_plan(out_dir: str) -> RewritePlan | None:
    """The rewrite plan of an incremental reconcile, or None for a full table (snapshot)."""
    uri = storage.join(out_dir, PLAN_FILE)
    if not storage.exists(uri):
        return None
    data = json.loads(storage.read_bytes(uri))
    return RewritePlan(int(data["base_version"]), tuple(int(s) for s in data["slots"]),
                       str(data["slot_column"]))


def slot_dir(out_dir: str, plan: RewritePlan, slot: int) -> str:
    return storage.join(out_dir, f"{plan.slot_column}={slot}")


def slot_column(columns: Sequence[str]) -> str:
    """A name for the slot column that no table column has (it names directories, so no ``_``).

    >>> slot_column(["id", "tm_slot"])
    'tm_slot1'
    """
    taken = {c.lower() for c in columns}
    name, n = "tm_slot", 0
    while (name if n == 0 else f"{name}{n}") in taken:
        n += 1
    return name if n == 0 else f"{name}{n}"


# --------------------------------------------------------------------------- writing data files


def data_file(version: int, index: int) -> str:
    """A data file's path relative to the table dir.

    >>> data_file(2, 0)
    'data/v000002-c0000.parquet'
    """
    return f"{DATA_DIR}/v{version:06d}-c{index:04d}.parquet"


class VersionWriter:
    """Writes the new data files of one version, in key order, and says what each holds.

    Args:
        tdir: the table dir.
        version: the version being written (names its files).
        schema: the published schema.
        key: the chunk-key columns (the ranges are of these).
    """

    def __init__(self, tdir: str, version: int, schema: pa.Schema, key: Sequence[str]) -> None:
        self.tdir, self.version, self.schema, self.key = tdir, version, schema, list(key)
        self.files_written = 0
        self.rows_written = 0

    def write_all(self, reconciled_dir: str) -> list[FileRange]:
        """A whole table: the staging files in order (Spark wrote them range-partitioned, so
        their keys ascend across files), cut into files of about the target size."""
        parts = [p for p in map(_staging_part, storage.list_files(reconciled_dir, suffix=".parquet")) if p.rows]
        return self._write(parts, rows_per_file=0, bytes_per_file=TARGET_FILE_BYTES)

    def write_incremental(self, reconciled_dir: str, plan: RewritePlan, ranges: Sequence[FileRange]
                          ) -> list[FileRange]:
        """The base version's files (``ranges``: its `usable_ranges`) in key order, each
        rewritten slot replaced by what the reconcile wrote for it; small new files merged
        with small neighbours, a new file over twice the target split in equal pieces."""
        rewritten = set(plan.slots)
        rows, nbytes = sum(r["rows"] for r in ranges), sum(r["bytes"] for r in ranges)
        row_bytes = nbytes / rows if rows else None  # published bytes per row, to size new files
        parts: list[Part] = []
        for slot in range(HEAD_SLOT, len(ranges) + 1):
            if slot in rewritten:
                parts += _slot_parts(slot_dir(reconciled_dir, plan, slot), row_bytes)
            elif 0 <= slot < len(ranges):
                entry = ranges[slot]
                parts.append(Part(storage.join(self.tdir, entry["file"]), entry["rows"], entry["bytes"], entry))
        out: list[FileRange] = []
        for group in group_parts(parts, SMALL_FILE_BYTES):
            members = [parts[i] for i in group]
            shared = members[0].shared
            if len(members) == 1 and shared is not None:
                out.append(shared)
            else:
                total_rows, total_bytes = sum(p.rows for p in members), sum(p.bytes for p in members)
                out += self._write(members, piece_rows(total_rows, total_bytes, TARGET_FILE_BYTES), 0)
        return out

    def _write(self, parts: Sequence[Part], rows_per_file: int, bytes_per_file: int) -> list[FileRange]:
        """Concatenate adjacent parts (their keys ascend across them) into new files."""
        batches = itertools.chain.from_iterable(self._batches(p.uri) for p in parts)
        written = _write_files(self.tdir, self.version, self.files_written, self.schema, self.key,
                               batches, rows_per_file, bytes_per_file)
        self.files_written += len(written)
        self.rows_written += sum(r["rows"] for r in written)
        return written

    def write_empty(self) -> FileRange:
        """The one file of an empty table: no rows, the schema."""
        relative = data_file(self.version, self.files_written)
        fs, path = storage.filesystem(storage.join(self.tdir, relative))
        fs.create_dir(storage.parent(path), recursive=True)
        with fs.open_output_stream(path) as out:
            pq.write_table(self.schema.empty_table(), out, compression="snappy")
        self.files_written += 1
        return FileRange(file=relative, min_key=None, max_key=None, rows=0,
                         bytes=storage.size(storage.join(self.tdir, relative)))

    def _batches(self, uri: str) -> Iterator[pa.RecordBatch]:
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=BATCH_ROWS, columns=self.schema.names):
                yield to_published(batch, self.schema)


def _staging_part(uri: str) -> Part:
    fs, path = storage.filesystem(uri)
    with fs.open_input_file(path) as handle:
        rows = pq.ParquetFile(handle).metadata.num_rows
    return Part(uri, rows, storage.size(uri))


def _slot_parts(directory: str, row_bytes: float | None) -> list[Part]:
    """The staging file of a rewritten slot (none when the slot lost all its rows), its
    ``bytes`` estimated in published bytes from the table's bytes per row."""
    parts = [p for p in map(_staging_part, storage.list_files(directory, suffix=".parquet")) if p.rows]
    if len(parts) > 1:
        raise RunFailed(f"internal: {directory} holds {len(parts)} files, the layout needs one per slot; "
                        "rerun to reconcile again")
    if row_bytes is None:
        return parts
    return [Part(p.uri, p.rows, round(p.rows * row_bytes)) for p in parts]


class _OpenFile:
    """A published data file being written: counts rows and remembers its first and last key."""

    def __init__(self, tdir: str, relative: str, schema: pa.Schema, key: Sequence[str]) -> None:
        self.relative, self.uri, self.key = relative, storage.join(tdir, relative), key
        fs, path = storage.filesystem(self.uri)
        fs.create_dir(storage.parent(path), recursive=True)
        self._stream = fs.open_output_stream(path)
        self._writer = pq.ParquetWriter(self._stream, schema, compression="snappy")
        self.rows = 0
        self._first: list[Any] | None = None
        self._last: pa.RecordBatch | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._first is None:
            self._first = _key_at(batch, self.key, 0)
        self._writer.write_batch(batch)
        self._last = batch
        self.rows += batch.num_rows

    @property
    def size(self) -> int:
        """Bytes written so far (each batch is flushed as a row group)."""
        return int(self._stream.tell())

    def close(self) -> FileRange:
        self._writer.close()
        self._stream.close()
        last = self._last
        assert last is not None and self._first is not None, "a data file is opened for a row"
        return FileRange(file=self.relative, min_key=self._first, max_key=_key_at(last, self.key, -1),
                         rows=self.rows, bytes=storage.size(self.uri))

    def abort(self) -> None:
        self._writer.close()
        self._stream.close()


def _key_at(batch: pa.RecordBatch, key: Sequence[str], index: int) -> list[Any]:
    row = index if index >= 0 else batch.num_rows + index
    encoded = encode_key(tuple(batch.column(k)[row].as_py() for k in key))
    assert encoded is not None
    return encoded


def _write_files(tdir: str, version: int, first_index: int, schema: pa.Schema, key: Sequence[str],
                 batches: Iterable[pa.RecordBatch], rows_per_file: int, bytes_per_file: int) -> list[FileRange]:
    """Write rows in key order to new files of ``version``: a new file after ``rows_per_file``
    rows, or once a file has ``bytes_per_file`` bytes (checked between batches); 0 is no limit."""
    out: list[FileRange] = []
    current: _OpenFile | None = None
    try:
        for batch in batches:
            offset = 0
            while offset < batch.num_rows:
                if current is None:
                    current = _OpenFile(tdir, data_file(version, first_index + len(out)), schema, key)
                take = batch.num_rows - offset
                if rows_per_file > 0:
                    take = min(take, rows_per_file - current.rows)
                current.write(batch.slice(offset, take))
                offset += take
                if ((rows_per_file > 0 and current.rows >= rows_per_file)
                        or (bytes_per_file > 0 and current.size >= bytes_per_file)):
                    out.append(current.close())
                    current = None
        if current is not None:
            out.append(current.close())
            current = None
    finally:
        if current is not None:
            current.abort()
    return out


def to_published(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A staging record batch in published types (TIME int64 micros -> duration[us])."""
    arrays = []
    for field in schema:
        array = batch.column(field.name)
        if pa.types.is_duration(field.type) and not pa.types.is_duration(array.type):
            array = array.cast(pa.int64()).view(field.type)
        elif array.type != field.type:
            array = array.cast(field.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
