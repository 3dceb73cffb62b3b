"""Writing data files: one key range per file, in key order, in published types with field IDs.

- `write_parts`: the new files of a version (`layout.VersionPlan`) from its parts in key
  order (`layout.Part`: kept files, rewritten slots, staging files), grouped by
  `layout.group_parts`; groups are written in parallel, each by one thread (pyarrow does its
  work outside the GIL), into a staging directory that publish moves the files out of.
- `VersionWriter`: a whole table from staging files, straight into the table's ``data/``
  (publish, for a reconciled directory without a plan).

Every file is written with the schema given (the Iceberg field IDs on its fields) and reports
its `layout.FileRange`: first and last key, rows, bytes.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chunking import encode_key
from orchestrator.config import lakes
from orchestrator.lake import layout, readahead, storage
from orchestrator.lake.layout import DATA_DIR, FileRange, Part, PlannedFile, piece_rows, planned

#: Parquet options of every data file Tidemark writes with pyarrow: zstd without dictionary
#: pages. Measured on 1M rows of shop.orders' columns (best of 3, seconds to write / read back,
#: MB): snappy with dictionaries 0.36 / 0.20 / 37.9; snappy 0.19 / 0.17 / 29.1; zstd
#: 0.22 / 0.14 / 16.6; lz4 0.26 / 0.24 / 27.2. A rewrite reads and writes every row of its files.
#: A DECIMAL of precision up to 18 is stored as a 32- or 64-bit integer, the physical type the
#: Iceberg spec gives it and Spark writes, not as fixed-length bytes: on 4M rows of shop.orders
#: (its ``amount``), files 8% smaller, read back 1.19x as fast, a rewrite of them 1.03x
#: (docs/performance.md, bench/bench_rewrite.py).
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": False,
    "store_decimal_as_integer": True,
}

#: The encoding of every column Parquet stores as a 32- or 64-bit integer (integers, dates,
#: times, timestamps, decimals of precision up to 18) where ``output.integer_encoding`` is
#: ``delta`` (the default): the differences between neighbouring values, bit-packed, before
#: zstd. Keys, counters and timestamps in key order differ little from row to row. Measured
#: (bench/bench_rewrite.py, 4M rows of shop.orders, 10,000 spread changes; docs/performance.md):
#: with the sample's values a rewrite 1.21x as fast, files 4.4x smaller; with random values
#: 1.07x, files 15% smaller. Every reader Tidemark is tested with reads it; Iceberg's vectorized
#: Spark reader does from Iceberg 1.10 on, hence ``plain`` (docs/output.md).
INTEGER_ENCODING: str | None = "DELTA_BINARY_PACKED"


#: The encoding of every whole-number DECIMAL wider than 18 digits (a BIGINT UNSIGNED is
#: published as DECIMAL(20, 0)), which Parquet stores as fixed-length big-endian bytes, under
#: the same ``output.integer_encoding: delta``: each value as the length of the bytes it shares
#: with the one before and the rest. Neighbouring keys share all but their last bytes. Measured
#: on 4M rows of shop.orders, whose key is a BIGINT UNSIGNED (docs/performance.md): that column
#: 19x smaller (it was 55% of the files' bytes), written 1.3x as fast. pyarrow, DuckDB, Trino
#: and Spark read it; BYTE_STREAM_SPLIT, smaller still, DuckDB refuses for a DECIMAL.
WIDE_INTEGER_ENCODING = "DELTA_BYTE_ARRAY"


def parquet_options(schema: pa.Schema, uri: str) -> dict[str, Any]:
    """The pyarrow writer options of a data file of ``schema`` at ``uri``: `PARQUET_OPTIONS`, and
    `INTEGER_ENCODING` for each top-level column stored as a Parquet INT32 or INT64
    (`WIDE_INTEGER_ENCODING` for a whole-number DECIMAL stored as bytes) unless the config whose
    lake or staging path holds ``uri`` says ``output.integer_encoding: plain``.

    >>> schema = pa.schema([("id", pa.int64()), ("name", pa.string()),
    ...                     ("u", pa.decimal128(20, 0)), ("d", pa.decimal128(30, 2))])
    >>> parquet_options(schema, "/nowhere/t/data/f.parquet")["column_encoding"]
    {'id': 'DELTA_BINARY_PACKED', 'u': 'DELTA_BYTE_ARRAY'}
    """
    if INTEGER_ENCODING is None or lakes.integer_encoding(uri) == "plain":
        return dict(PARQUET_OPTIONS)
    decimals = 18 if PARQUET_OPTIONS.get("store_decimal_as_integer") else 0
    integers = {
        f.name: INTEGER_ENCODING
        for f in schema
        if pa.types.is_integer(f.type)
        or pa.types.is_date(f.type)
        or pa.types.is_time(f.type)
        or pa.types.is_timestamp(f.type)
        or (pa.types.is_decimal(f.type) and f.type.precision <= decimals)
    }
    wide = {
        f.name: WIDE_INTEGER_ENCODING
        for f in schema
        if pa.types.is_decimal(f.type) and f.type.scale == 0 and f.name not in integers
    }
    return {**PARQUET_OPTIONS, "column_encoding": {**integers, **wide}}


#: How a part's rows are read: record batches in published types, in key order.
BatchesOf = Callable[[Part], Iterator[pa.RecordBatch]]

#: The Parquet field metadata holding a column's Iceberg field ID.
FIELD_ID = b"PARQUET:field_id"


def with_field_ids(schema: pa.Schema, ids: dict[str, int]) -> pa.Schema:
    """``schema`` with each field's Iceberg field ID as its one metadata entry, ``PARQUET:field_id``
    (the data files' schema: Spark's writer, which writes the chunk files, keeps no other field
    metadata, so neither do pyarrow's files; the manifest's ``columns`` name the MySQL types)."""
    return pa.schema(f.with_metadata({FIELD_ID: str(ids[f.name]).encode()}) for f in schema)


def data_file(version: int, index: int, attempt: str = "") -> str:
    """A data file's path relative to the table dir: the version, the publish attempt that
    writes it (unique to it: no other process ever writes that name), the file's index.

    >>> data_file(2, 0, "a1b2c3d4"), data_file(2, 1)
    ('data/v000002-a1b2c3d4-c0000.parquet', 'data/v000002-c0001.parquet')
    """
    tag = f"{attempt}-" if attempt else ""
    return f"{DATA_DIR}/v{version:06d}-{tag}c{index:04d}.parquet"


#: A data file's name: its version first (`data_file`; files of releases before attempts have no
#: tag).
DATA_FILE = re.compile(r"^v(\d{6,})-(?:[0-9a-f]+-)?c\d{4,}\.parquet$")


def file_version(name: str) -> int | None:
    """The version a data file was written for, from its name; None for another file.

    >>> (file_version("v000002-a1b2c3d4-c0000.parquet"), file_version("v000003-c0001.parquet"),
    ...  file_version("x"))
    (2, 3, None)
    """
    match = DATA_FILE.match(name)
    return int(match.group(1)) if match else None


def write_parts(
    out_dir: str,
    parts: Sequence[Part],
    groups: Sequence[Sequence[int]],
    schema: pa.Schema,
    key: Sequence[str],
    batches_of: BatchesOf,
    *,
    shared: bool,
    workers: int | None = None,
) -> list[PlannedFile]:
    """The files of a version, in key order: a group that is one kept part stays as it is (its
    `FileRange`; ``shared``: a file of the base version, else a finished staging file); every
    other group is written to new files in ``out_dir`` (``g<group>-<piece>.parquet``), cut into
    equal pieces when it would exceed twice `layout.TARGET_FILE_BYTES`. Groups are written
    ``workers`` at a time (default: the cores); one group alone, in the calling thread."""

    def write(index: int, members: list[Part]) -> list[FileRange]:
        rows = piece_rows(
            sum(p.rows for p in members), sum(p.bytes for p in members), layout.TARGET_FILE_BYTES
        )
        batches = itertools.chain.from_iterable(batches_of(p) for p in members)
        return write_files(
            out_dir, lambda n: f"g{index:06d}-{n:04d}.parquet", schema, key, batches, rows, 0
        )

    members = [[parts[i] for i in group] for group in groups]
    kept = [m[0].kept if len(m) == 1 else None for m in members]
    indexes = [index for index, k in enumerate(kept) if k is None]
    groups_to_write = [members[index] for index in indexes]
    threads = min(len(indexes), max(1, workers or os.cpu_count() or 1))
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="tidemark-write") as pool:
            written = dict(zip(indexes, pool.map(write, indexes, groups_to_write), strict=True))
    else:  # one group to write (a small table's one file): in this thread, no pool
        written = {
            index: write(index, m) for index, m in zip(indexes, groups_to_write, strict=True)
        }
    out: list[PlannedFile] = []
    for index, done in enumerate(kept):
        if done is not None:
            out.append(planned(done, done["file"], shared))
        else:
            out.extend(planned(f, storage.join(out_dir, f["file"]), False) for f in written[index])
    return out


class VersionWriter:
    """Writes a whole table's data files into the table's ``data/``, in key order.

    Args:
        tdir: the table dir.
        version: the version being written (names its files).
        schema: the published schema (with field IDs).
        key: the chunk-key columns (the ranges are of these).
        attempt: the publish attempt's tag (names its files, `data_file`).
    """

    def __init__(
        self, tdir: str, version: int, schema: pa.Schema, key: Sequence[str], attempt: str = ""
    ) -> None:
        self.tdir, self.version, self.schema, self.key = tdir, version, schema, list(key)
        self.attempt = attempt
        self.files_written = 0
        self.rows_written = 0

    def write_all(self, staging_dir: str) -> list[FileRange]:
        """A whole table: the staging files in order (their keys ascend across files), cut into
        files of about the target size."""
        uris = [
            u for u in storage.list_files(staging_dir, suffix=".parquet") if storage.parquet_rows(u)
        ]
        batches = itertools.chain.from_iterable(read_published(u, self.schema) for u in uris)
        written = write_files(
            self.tdir,
            lambda n: data_file(self.version, self.files_written + n, self.attempt),
            self.schema,
            self.key,
            batches,
            0,
            layout.TARGET_FILE_BYTES,
        )
        self.files_written += len(written)
        self.rows_written += sum(r["rows"] for r in written)
        return written

    def sync(self, ranges: Iterable[FileRange]) -> None:
        """The files of ``ranges`` written for this version on disk, and ``data/``'s names of them:
        a local lake's data files (written by Spark or pyarrow, moved in by rename) are made
        durable before an Iceberg commit names them; a file shared with an earlier version is."""
        new = [
            storage.join(self.tdir, r["file"])
            for r in ranges
            if file_version(os.path.basename(r["file"])) == self.version
        ]
        storage.sync([*new, storage.join(self.tdir, DATA_DIR)])

    def write_empty(self) -> FileRange:
        """The one file of an empty table: no rows, the schema."""
        relative = data_file(self.version, self.files_written, self.attempt)
        nbytes = write_empty(storage.join(self.tdir, relative), self.schema)
        self.files_written += 1
        return FileRange(file=relative, min_key=None, max_key=None, rows=0, bytes=nbytes)


def write_empty(uri: str, schema: pa.Schema) -> int:
    """A Parquet file of ``schema`` without rows; returns its size."""
    return write_table(uri, schema.empty_table())


def write_table(uri: str, table: pa.Table) -> int:
    """``table`` as one Parquet data file at ``uri`` (its schema, field IDs included); returns its
    size (the bytes written: not asked of the store, a request on S3)."""
    fs, path = storage.filesystem(uri)
    storage.parent_made(fs, path)
    storage.forget_parquet(uri)
    with fs.open_output_stream(path) as out:
        pq.write_table(table, out, **parquet_options(table.schema, uri))
        return int(out.tell())


def read_published(
    uri: str, schema: pa.Schema, *, use_threads: bool = False
) -> Iterator[pa.RecordBatch]:
    """The rows of a data or staging file as record batches in ``schema``'s types
    (`to_published`); those of a file read ahead (`orchestrator.lake.readahead`) from memory."""
    ahead = readahead.take(uri)
    if ahead is not None and (not ahead or set(schema.names) <= set(ahead[0].schema.names)):
        while ahead:  # each batch let go once converted: the merge holds one at a time
            yield to_published(ahead.pop(0), schema)
        return
    with storage.open_parquet(uri) as handle:
        reader = pq.ParquetFile(handle)
        for batch in reader.iter_batches(
            batch_size=layout.BATCH_ROWS, columns=schema.names, use_threads=use_threads
        ):
            yield to_published(batch, schema)


def file_range(uri: str, key: Sequence[str], relative: str | None = None) -> FileRange:
    """The `FileRange` of a data file sorted by key: its first and last key (read from its first
    and last row group only), rows and bytes; ``relative`` names it (default: ``uri``)."""
    with storage.open_parquet(uri) as handle:
        nbytes = handle.size()  # known from the open: no second request on S3
        reader = pq.ParquetFile(handle)
        rows = reader.metadata.num_rows
        first = last = None
        if rows:
            groups = [
                g for g in range(reader.num_row_groups) if reader.metadata.row_group(g).num_rows
            ]
            head = reader.read_row_group(groups[0], columns=list(key))
            tail = (
                head
                if groups[-1] == groups[0]
                else reader.read_row_group(groups[-1], columns=list(key))
            )
            first, last = key_at(head, key, 0), key_at(tail, key, -1)
    return FileRange(file=relative or uri, min_key=first, max_key=last, rows=rows, bytes=nbytes)


class _OpenFile:
    """A data file being written: counts rows and remembers its first and last key."""

    def __init__(self, uri: str, relative: str, schema: pa.Schema, key: Sequence[str]) -> None:
        self.relative, self.uri, self.key = relative, uri, key
        fs, path = storage.filesystem(self.uri)
        storage.parent_made(fs, path)
        storage.forget_parquet(self.uri)
        self._stream = fs.open_output_stream(path)
        self._writer = pq.ParquetWriter(self._stream, schema, **parquet_options(schema, uri))
        self.rows = 0
        self._first: list[Any] | None = None
        self._last: pa.RecordBatch | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if self._first is None:
            self._first = key_at(batch, self.key, 0)
        self._writer.write_batch(batch)
        self._last = batch
        self.rows += batch.num_rows

    @property
    def size(self) -> int:
        """Bytes written so far (each batch is flushed as a row group)."""
        return int(self._stream.tell())

    def close(self) -> FileRange:
        self._writer.close()  # the footer written: the file's size is the bytes written
        nbytes = self.size
        self._stream.close()
        last = self._last
        assert last is not None and self._first is not None, "a data file is opened for a row"
        return FileRange(
            file=self.relative,
            min_key=self._first,
            max_key=key_at(last, self.key, -1),
            rows=self.rows,
            bytes=nbytes,
        )

    def abort(self) -> None:
        self._writer.close()
        self._stream.close()


def key_at(batch: pa.RecordBatch | pa.Table, key: Sequence[str], index: int) -> list[Any]:
    """The encoded key (`chunking.encode_key`) of row ``index`` (negative: from the end), as a
    `FileRange` holds it."""
    row = index if index >= 0 else batch.num_rows + index
    encoded = encode_key(tuple(batch.column(k)[row].as_py() for k in key))
    assert encoded is not None
    return encoded


def write_files(
    directory: str,
    name: Callable[[int], str],
    schema: pa.Schema,
    key: Sequence[str],
    batches: Iterable[pa.RecordBatch],
    rows_per_file: int,
    bytes_per_file: int,
) -> list[FileRange]:
    """Write rows in key order to new files ``directory/name(0)``, ``name(1)``, ...: a new file
    after ``rows_per_file`` rows, or once a file has ``bytes_per_file`` bytes (checked between
    batches); 0 is no limit. Empty batches are skipped; no rows, no file."""
    out: list[FileRange] = []
    current: _OpenFile | None = None
    try:
        for batch in batches:
            offset = 0
            while offset < batch.num_rows:
                if current is None:
                    relative = name(len(out))
                    current = _OpenFile(storage.join(directory, relative), relative, schema, key)
                take = batch.num_rows - offset
                if rows_per_file > 0:
                    take = min(take, rows_per_file - current.rows)
                current.write(batch.slice(offset, take))
                offset += take
                if (rows_per_file > 0 and current.rows >= rows_per_file) or (
                    bytes_per_file > 0 and current.size >= bytes_per_file
                ):
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
