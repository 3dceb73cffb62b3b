"""Writing a version's data files: one key range per file, in key order.

`VersionWriter` turns reconciled staging files (a whole table, or the rewritten
slots of an incremental run) into published Parquet files of about
`layout.TARGET_FILE_BYTES` each, and reports each file's key range
(`layout.FileRange`) for the manifest.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chunking import encode_key
from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import (
    DATA_DIR,
    HEAD_SLOT,
    FileRange,
    Part,
    RewritePlan,
    group_parts,
    piece_rows,
    slot_dir,
)


def data_file(version: int, index: int, attempt: str = "") -> str:
    """A data file's path relative to the table dir: the version, the publish attempt that
    writes it (unique to it: no other process ever writes that name), the file's index.

    >>> data_file(2, 0, "a1b2c3d4"), data_file(2, 1)
    ('data/v000002-a1b2c3d4-c0000.parquet', 'data/v000002-c0001.parquet')
    """
    tag = f"{attempt}-" if attempt else ""
    return f"{DATA_DIR}/v{version:06d}-{tag}c{index:04d}.parquet"


#: A data file's name: its version first (`data_file`; files of releases before attempts have no tag).
DATA_FILE = re.compile(r"^v(\d{6,})-(?:[0-9a-f]+-)?c\d{4,}\.parquet$")


def file_version(name: str) -> int | None:
    """The version a data file was written for, from its name; None for another file.

    >>> file_version("v000002-a1b2c3d4-c0000.parquet"), file_version("v000003-c0001.parquet"), file_version("x")
    (2, 3, None)
    """
    match = DATA_FILE.match(name)
    return int(match.group(1)) if match else None


class VersionWriter:
    """Writes the new data files of one version, in key order, and says what each holds.

    Args:
        tdir: the table dir.
        version: the version being written (names its files).
        schema: the published schema.
        key: the chunk-key columns (the ranges are of these).
        attempt: the publish attempt's tag (names its files, `data_file`).
    """

    def __init__(self, tdir: str, version: int, schema: pa.Schema, key: Sequence[str], attempt: str = "") -> None:
        self.tdir, self.version, self.schema, self.key = tdir, version, schema, list(key)
        self.attempt = attempt
        self.files_written = 0
        self.rows_written = 0

    def write_all(self, reconciled_dir: str) -> list[FileRange]:
        """A whole table: the staging files in order (Spark wrote them range-partitioned, so
        their keys ascend across files), cut into files of about the target size."""
        parts = [p for p in map(_staging_part, storage.list_files(reconciled_dir, suffix=".parquet")) if p.rows]
        return self._write(parts, rows_per_file=0, bytes_per_file=layout.TARGET_FILE_BYTES)

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
        for group in group_parts(parts, layout.SMALL_FILE_BYTES):
            members = [parts[i] for i in group]
            shared = members[0].shared
            if len(members) == 1 and shared is not None:
                out.append(shared)
            else:
                total_rows, total_bytes = sum(p.rows for p in members), sum(p.bytes for p in members)
                out += self._write(members, piece_rows(total_rows, total_bytes, layout.TARGET_FILE_BYTES), 0)
        return out

    def _write(self, parts: Sequence[Part], rows_per_file: int, bytes_per_file: int) -> list[FileRange]:
        """Concatenate adjacent parts (their keys ascend across them) into new files."""
        batches = itertools.chain.from_iterable(self._batches(p.uri) for p in parts)
        written = _write_files(self.tdir, lambda i: data_file(self.version, self.files_written + i, self.attempt),
                               self.schema, self.key, batches, rows_per_file, bytes_per_file)
        self.files_written += len(written)
        self.rows_written += sum(r["rows"] for r in written)
        return written

    def write_empty(self) -> FileRange:
        """The one file of an empty table: no rows, the schema."""
        relative = data_file(self.version, self.files_written, self.attempt)
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
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=layout.BATCH_ROWS, columns=self.schema.names):
                yield to_published(batch, self.schema)


def _staging_part(uri: str) -> Part:
    rows = storage.parquet_rows(uri)
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


def _write_files(tdir: str, name: Callable[[int], str], schema: pa.Schema, key: Sequence[str],
                 batches: Iterable[pa.RecordBatch], rows_per_file: int, bytes_per_file: int) -> list[FileRange]:
    """Write rows in key order to new files ``name(0)``, ``name(1)``...: a new file after ``rows_per_file``
    rows, or once a file has ``bytes_per_file`` bytes (checked between batches); 0 is no limit."""
    out: list[FileRange] = []
    current: _OpenFile | None = None
    try:
        for batch in batches:
            offset = 0
            while offset < batch.num_rows:
                if current is None:
                    current = _OpenFile(tdir, name(len(out)), schema, key)
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
    """A staging record batch in published types (a file of an older version may hold TIME
    as duration[us]: it is read as its int64 microseconds)."""
    arrays = []
    for field in schema:
        array = batch.column(field.name)
        if pa.types.is_duration(array.type):
            array = array.view(pa.int64())
        if array.type != field.type:
            array = array.cast(field.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
