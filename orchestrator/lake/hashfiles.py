"""Data files of a table without a key: rows sorted by their hash, each file one hash range.

The layout of such a table (docs/output.md, "Tables without a key") is the keyed layout with
`orchestrator.lake.rowhash.row_hashes` in place of the key: each file holds the rows of one hash
range sorted by hash, the files' ranges are disjoint and ascending, and the manifest's
``file_ranges`` give each file's first and last hash (``[h]``). Rows of one hash never straddle
two files (`cut_points`), so identical rows are in one file, and a row is looked for in the one
file whose range holds its hash.

`HashBuckets` takes a table's rows as a read streams them and spills them, sorted by hash, into
local temporary files (lz4-compressed Arrow, a record batch per hash range, in the system's
temporary directory: the table's rows pass through it once); `HashBuckets.write` then gathers
one hash range at a time and writes the data files: memory holds one range, about
``rows_per_file`` rows, never the table.
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


@dataclass(frozen=True, slots=True)
class _Spill:
    """A spill file: one record batch per hash range of its set, rows sorted by hash, and the
    rows of each batch."""

    path: str
    counts: tuple[int, ...]

    def rows(self, part: int) -> pa.Table:
        with pa.memory_map(self.path) as source:
            return pa.Table.from_batches([pa.ipc.open_file(source).get_batch(part)])


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
    _spills: list[_Spill] = field(default_factory=list)
    _files: int = 0
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
        """Write the rows held to a spill file, a record batch per bucket."""
        if not self._held:
            return
        rows = pa.concat_tables([r for r, _ in self._held])
        hashes = np.concatenate([h for _, h in self._held])
        self._held, self._held_rows = [], 0
        self._spills.append(self._spill_file(*sort_by_hash(rows, hashes), 0, 1 << 64, self.buckets))

    def _spill_file(
        self, rows: pa.Table, hashes: np.ndarray, low: int, width: int, parts: int
    ) -> _Spill:
        """``rows`` (sorted by their ``hashes``, all in ``[low, low + width)``) as a spill file of
        ``parts`` record batches, one per equal part of that range."""
        edges = np.array([low + k * width // parts for k in range(1, parts)], np.uint64)
        bounds = [0, *np.searchsorted(hashes, edges, side="left").tolist(), len(hashes)]
        self._files += 1
        path = os.path.join(self._dir.name, f"s{self._files:06d}.arrow")
        table = rows.append_column(_HASH, pa.array(hashes, pa.uint64()))
        options = pa.ipc.IpcWriteOptions(compression="lz4")  # fast; each batch is read once
        with (
            pa.OSFile(path, "wb") as sink,
            pa.ipc.new_file(sink, table.schema, options=options) as writer,
        ):
            for start, end in itertools.pairwise(bounds):
                writer.write_batch(
                    table.slice(start, end - start).combine_chunks().to_batches()[0]
                    if end > start
                    else _empty_batch(table.schema)
                )
        return _Spill(path, tuple(b - a for a, b in itertools.pairwise(bounds)))

    def write(self, name: Callable[[int], str], guard: Callable[[], None]) -> list[FileRange]:
        """The data files, in hash order, each named ``name(n)`` (a URI); ``guard`` is checked
        before the first is written."""
        self._spill()
        guard()
        out: list[FileRange] = []
        self._write_parts(self._spills, 0, 1 << 64, self.buckets, name, out)
        return out

    def _write_parts(
        self,
        spills: list[_Spill],
        low: int,
        width: int,
        parts: int,
        name: Callable[[int], str],
        out: list[FileRange],
    ) -> None:
        """Append to ``out`` the files of each part of ``[low, low + width)`` the ``spills``
        hold: sorted in memory, or, a part too big for that (`BUCKET_SLACK`), spilled again in
        `SPLIT` parts of its own."""
        for part in range(parts):
            count = sum(s.counts[part] for s in spills)
            if count == 0:
                continue
            start, end = low + part * width // parts, low + (part + 1) * width // parts
            if count > BUCKET_SLACK * self.rows_per_file and end - start >= SPLIT:
                again = []
                for spill in spills:
                    if spill.counts[part]:
                        table = spill.rows(part)
                        hashes = table.column(_HASH).to_numpy().astype(np.uint64)
                        rows = table.drop_columns([_HASH])
                        again.append(self._spill_file(rows, hashes, start, end - start, SPLIT))
                self._write_parts(again, start, end - start, SPLIT, name, out)
                continue
            table = pa.concat_tables([s.rows(part) for s in spills if s.counts[part]])
            rows, hashes = sort_by_hash(
                table.drop_columns([_HASH]), table.column(_HASH).to_numpy().astype(np.uint64)
            )
            out += write_sorted(_after(name, len(out)), rows, hashes, self.rows_per_file)


_HASH = "_tm_hash"


def _after(name: Callable[[int], str], written: int) -> Callable[[int], str]:
    """``name`` numbering on after the ``written`` files before."""
    return lambda i: name(written + i)


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


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
