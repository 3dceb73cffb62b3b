"""Data files of a table without a key: rows sorted by their hash, each file one hash range.

The layout of such a table (docs/output.md, "Tables without a key") is the keyed layout with
`orchestrator.lake.rowhash.row_hashes` in place of the key: each file holds the rows of one hash
range sorted by hash, the files' ranges are disjoint and ascending, and the manifest's
``file_ranges`` give each file's first and last hash (``[h]``). Rows of one hash never straddle
two files (`cut_points`), so identical rows are in one file, and a row is looked for in the one
file whose range holds its hash.

`HashBuckets` takes a table's rows as a read streams them and spills them, sorted by hash, into
local temporary files (lz4-compressed Arrow: about half the bytes of the rows, in the system's
temporary directory); `HashBuckets.write` then gathers one hash range at a time and writes the data
files: memory holds one range, about ``rows_per_file`` rows, never the table.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from orchestrator.lake.layout import FileRange
from orchestrator.lake.rowhash import row_hashes
from orchestrator.lake.writer import write_table

#: The most buckets a read spills into (each is at least one data file).
MAX_BUCKETS = 1024
#: A bucket is sorted in memory up to this many times the rows per file; a bigger one (a row
#: estimate far too low) is spilled again into `SPLIT` buckets by the next bits of the hash.
BUCKET_SLACK = 4
SPLIT = 16
#: Rows a read holds before it spills them (all buckets together).
SPILL_ROWS = 100_000


def cut_points(hashes: np.ndarray, rows_per_file: int) -> list[int]:
    """Where to cut rows sorted by ``hashes`` into files of about ``rows_per_file`` rows, never
    between two rows of one hash: the start of each file but the first.

    >>> cut_points(np.array([1, 2, 2, 2, 3, 4], dtype=np.uint64), 2)
    [4]
    >>> cut_points(np.array([1, 2, 3, 4, 5], dtype=np.uint64), 2)
    [2, 4]
    """
    cuts: list[int] = []
    at = rows_per_file
    while at < len(hashes):
        # the first row at or after `at` whose hash differs from the row before it
        at = int(np.searchsorted(hashes, hashes[at - 1], side="right"))
        if at >= len(hashes):
            break
        cuts.append(at)
        at += rows_per_file
    return cuts


def write_sorted(
    name: Callable[[int], str],
    rows: pa.Table,
    hashes: np.ndarray,
    rows_per_file: int,
) -> list[FileRange]:
    """Write ``rows``, sorted by ``hashes``, as files ``name(0)``, ``name(1)``, ... (URIs) of
    about ``rows_per_file`` rows each (`cut_points`); their `FileRange`s (``file``: the URI)."""
    out: list[FileRange] = []
    bounds = [0, *cut_points(hashes, max(1, rows_per_file)), len(hashes)]
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        if end <= start:
            continue
        uri = name(i)
        nbytes = write_table(uri, rows.slice(start, end - start))
        out.append(
            FileRange(
                file=uri,
                min_key=[int(hashes[start])],
                max_key=[int(hashes[end - 1])],
                rows=end - start,
                bytes=nbytes,
            )
        )
    return out


def sort_by_hash(rows: pa.Table, hashes: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """``rows`` and their ``hashes`` in hash order (rows of one hash in the order given)."""
    order = np.argsort(hashes, kind="stable")
    return rows.take(pa.array(order)), hashes[order]


@dataclass
class HashBuckets:
    """A table's rows spilled by hash into local files, then written as its data files.

    Args:
        schema: the data file schema.
        buckets: how many (a power of two, up to `MAX_BUCKETS`; `bucket_count`).
        rows_per_file: the target rows of a data file.
    """

    schema: pa.Schema
    buckets: int
    rows_per_file: int
    _dir: tempfile.TemporaryDirectory[str] = field(
        default_factory=lambda: tempfile.TemporaryDirectory(prefix="tidemark-keyless-")
    )
    _held: list[tuple[pa.Table, np.ndarray]] = field(default_factory=list)
    _held_rows: int = 0
    _spills: int = 0
    rows: int = 0

    def __enter__(self) -> HashBuckets:
        return self

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()

    def add(self, rows: pa.Table) -> None:
        """Take rows of the table (in the data file schema)."""
        if not rows.num_rows:
            return
        self._held.append((rows, row_hashes(rows)))
        self._held_rows += rows.num_rows
        self.rows += rows.num_rows
        if self._held_rows >= SPILL_ROWS:
            self._spill()

    def _spill(self) -> None:
        """Write the rows held to a spill file per bucket (sorted by hash, so a bucket's rows are
        one slice of each)."""
        if not self._held:
            return
        rows = pa.concat_tables([r for r, _ in self._held])
        hashes = np.concatenate([h for _, h in self._held])
        self._held, self._held_rows = [], 0
        rows, hashes = sort_by_hash(rows, hashes)
        self._spills += 1
        _write_spill(
            os.path.join(self._dir.name, f"s{self._spills:06d}.arrow"),
            rows.append_column(_HASH, pa.array(hashes)),
        )

    def write(self, name: Callable[[int], str], guard: Callable[[], None]) -> list[FileRange]:
        """The data files, in hash order, each named ``name(n)`` (a URI); ``guard`` is checked
        before the first is written."""
        self._spill()
        guard()
        spills = [os.path.join(self._dir.name, f) for f in sorted(os.listdir(self._dir.name))]
        out: list[FileRange] = []
        width = 1 << (64 - (self.buckets.bit_length() - 1))  # hashes per bucket
        for bucket in range(self.buckets):
            self._write_range(spills, bucket * width, (bucket + 1) * width - 1, name, out)
        return out

    def _write_range(
        self,
        spills: list[str],
        low: int,
        high: int,
        name: Callable[[int], str],
        out: list[FileRange],
    ) -> None:
        """Append to ``out`` the files of the rows whose hash is in ``[low, high]``: sorted in
        memory, or, when they are too many (`BUCKET_SLACK`), range by range in `SPLIT` parts."""
        count = sum(_count_between(s, low, high) for s in spills)
        if count == 0:
            return
        if count > BUCKET_SLACK * self.rows_per_file and high - low >= SPLIT:
            step = (high - low + 1) // SPLIT
            for part in range(SPLIT):
                start = low + part * step
                self._write_range(
                    spills, start, high if part == SPLIT - 1 else start + step - 1, name, out
                )
            return
        table = pa.concat_tables([_read_between(s, low, high) for s in spills])
        rows, hashes = sort_by_hash(
            table.drop_columns([_HASH]), table.column(_HASH).to_numpy().astype(np.uint64)
        )
        first = len(out)
        out += write_sorted(lambda i: name(first + i), rows, hashes, self.rows_per_file)


_HASH = "_tm_hash"


def bucket_count(estimated_rows: int | None, rows_per_file: int) -> int:
    """Buckets for a table of about ``estimated_rows`` rows: a power of two near one per
    ``rows_per_file`` rows, at most `MAX_BUCKETS`.

    >>> bucket_count(None, 1000), bucket_count(4_000_000, 200_000), bucket_count(10**12, 1)
    (1, 32, 1024)
    """
    wanted = max(1, -(-(estimated_rows or 0) // max(1, rows_per_file)))
    count = 1
    while count < wanted and count < MAX_BUCKETS:
        count *= 2
    return count


def _write_spill(path: str, table: pa.Table) -> None:
    options = pa.ipc.IpcWriteOptions(compression="lz4")  # fast; the spill is read back once
    with (
        pa.OSFile(path, "wb") as sink,
        pa.ipc.new_file(sink, table.schema, options=options) as writer,
    ):
        writer.write_table(table)


def _spill_hashes(path: str) -> np.ndarray:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all().column(_HASH).to_numpy().astype(np.uint64)


def _count_between(path: str, low: int, high: int) -> int:
    hashes = _spill_hashes(path)
    return int(
        np.searchsorted(hashes, np.uint64(high), side="right")
        - np.searchsorted(hashes, np.uint64(low), side="left")
    )


def _read_between(path: str, low: int, high: int) -> pa.Table:
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    hashes = table.column(_HASH).to_numpy().astype(np.uint64)
    start = int(np.searchsorted(hashes, np.uint64(low), side="left"))
    end = int(np.searchsorted(hashes, np.uint64(high), side="right"))
    return table.slice(start, end - start)
