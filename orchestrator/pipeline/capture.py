"""Capture: the run's binlog row changes, up to the high position ``H``, into staging Parquet.

One pass over the binlog from the lowest start position (or the run's capture
checkpoint) to ``stop``, keeping the changes of the run's tables, each only
when it is after that table's own start. Changes are buffered per table and
written as numbered segments::

    <staging>/<run_id>/changes/<db>.<table>/seg-000001.parquet

with columns ``_tm_file, _tm_pos, _tm_row`` (the change's binlog position),
``_tm_op`` (``I``/``U``/``D``), every table column in its staging type (the
after image; for a delete the before image), then ``_tm_old_<c>`` for each
chunk-key column (the before-image key of updates and deletes).

Segment numbers run across the whole run. After the buffers are written at a
transaction boundary, the checkpoint records that boundary and the highest
segment number: segments up to it hold every kept change up to the boundary
and nothing after it. A resumed capture deletes higher-numbered segments
(written after the last checkpoint) and reads on from the boundary, so every
change lands in exactly one durable segment.

Rows events arrive undecoded (`orchestrator.binlog.reference.BinlogReader.events`); only
the run's tables' are kept, and rows at or before a table's start are dropped a
whole event at a time where they can be. Each table's events are decoded by
`orchestrator.binlog.batch.FastDecoding` into tuples of raw values, which
become Arrow column by column when a segment is written; ``decoder="library"``
decodes with python-mysql-replication instead (the reference, for tests and
benchmarks), into the same segments.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from orchestrator.binlog.batch import Decoding, FastDecoding
from orchestrator.binlog.reference import (
    BinlogReader,
    Boundary,
    LibraryDecoding,
    LibraryRows,
    RowsEvent,
    parse_mysql_json,
)
from orchestrator.config import PipelineConfig
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.runtime import faults
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import staging_schema, staging_type
from orchestrator.state.store import StateStore

log = logging.getLogger(__name__)

SEGMENT = re.compile(r"^seg-(\d{6,})\.parquet$")
#: Checkpoint at a boundary at least this often, even with little to write.
CHECKPOINT_SECONDS = 30.0
#: Log a progress line at most this often.
LOG_SECONDS = 10.0
META_COLUMNS = ("_tm_file", "_tm_pos", "_tm_row", "_tm_op")

_file_index = functools.lru_cache(maxsize=256)(file_index)

#: How rows events are decoded: Tidemark's own decoder, or python-mysql-replication's.
Decoder = Literal["fast", "library"]


@dataclass(frozen=True, slots=True)
class CaptureTable:
    """A table to capture.

    Attributes:
        info: its shape, from ``information_schema`` when the run was planned.
        key: its chunk key; ``_tm_old_<c>`` columns carry the before image of these.
        start: changes at or before this position are not kept (its snapshot or
            published version already holds them).
    """

    info: TableInfo
    key: tuple[str, ...]
    start: BinlogPosition


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """What a capture left in staging.

    Attributes:
        rows: changes per table in the run's durable segments (all of them, resumes included).
        segments: the highest durable segment number.
        end: the position everything up to which is captured (the stop position).
        resumed: whether this call continued from a checkpoint.
        seconds: how long this call took.
    """

    rows: dict[str, int]
    segments: int
    end: BinlogPosition
    resumed: bool = False
    seconds: float = 0.0


# --------------------------------------------------------------------------- staging paths


def _filesystem(staging: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of a staging location (local path or URI)."""
    if "://" not in staging and not os.path.isabs(staging):
        staging = os.path.abspath(staging)
    return pafs.FileSystem.from_uri(staging)


def segment_name(number: int) -> str:
    """The file name of segment ``number``.

    >>> segment_name(12)
    'seg-000012.parquet'
    """
    return f"seg-{number:06d}.parquet"


def _segments(fs: pafs.FileSystem, directory: str) -> list[tuple[int, str, str]]:
    """``(number, table, path)`` of every segment under ``directory``, in number order."""
    found = []
    for info in fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True)):
        match = SEGMENT.match(info.base_name)
        if info.type == pafs.FileType.File and match:
            table = info.path.rstrip("/").rsplit("/", 2)[-2]
            found.append((int(match.group(1)), table, info.path))
    return sorted(found)


def segment_paths(staging: str, run_id: str, table: str) -> list[str]:
    """The paths (within the staging filesystem) of a table's segments, in number order."""
    fs, root = _filesystem(staging)
    return [p for _, t, p in _segments(fs, f"{root}/{run_id}/changes") if t == table]


def read_changes(staging: str, run_id: str, table: str) -> pa.Table:
    """All of a table's captured changes in segment order (an empty table if there are none)."""
    fs, root = _filesystem(staging)
    parts = [pq.read_table(p, filesystem=fs) for n, t, p in _segments(fs, f"{root}/{run_id}/changes")
             if t == table]
    return pa.concat_tables(parts) if parts else pa.table({})


# --------------------------------------------------------------------------- segment writing


def key_indexes(table: CaptureTable) -> list[int]:
    """The positions of the table's chunk-key columns among its columns."""
    names = [c.name for c in table.info.columns]
    return [names.index(table.info.column(k).name) for k in table.key]


class _TableBuffer:
    """Buffered changes of one table and how to write them as a segment.

    Rows stay tuples (as the decoding gives them) until the segment is written;
    then each run of rows decoded under one TABLE_MAP shape becomes Arrow
    column by column.
    """

    def __init__(self, table: CaptureTable, decoding: Decoding) -> None:
        self.table = table
        self.decoding = decoding
        self.key_index = key_indexes(table)
        self.schema = self._schema()
        self.clear()

    def clear(self) -> None:
        self.files: list[int] = []
        self.positions: list[int] = []
        self.rows: list[int] = []
        self.ops: list[str] = []
        self.images: list[tuple[Any, ...]] = []
        self.keys: list[tuple[Any, ...]] = []
        self.shapes: list[tuple[Hashable, int]] = []  # (shape, index of its first row)

    def _schema(self) -> pa.Schema:
        meta = [pa.field(name, pa.string() if name == "_tm_op" else pa.int64(), False)
                for name in META_COLUMNS]
        old = [pa.field(f"_tm_old_{self.table.info.columns[i].name}",
                        staging_type(self.table.info.columns[i]), True) for i in self.key_index]
        return pa.schema([*meta, *staging_schema(self.table.info.columns), *old])

    def add(self, event: RowsEvent, file: int, first: int) -> int:
        """Decode the event's rows from index ``first`` on; returns how many were added."""
        shape, images, keys = self.decoding.rows(event)
        if first:
            images, keys = images[first:], keys[first:]
        count = len(images)
        if not self.shapes or self.shapes[-1][0] != shape:
            self.shapes.append((shape, len(self.images)))
        self.images += images
        self.keys += keys
        self.files += [file] * count
        self.positions += [event.end] * count
        self.rows += range(first, first + count)
        self.ops += [event.op] * count
        return count

    def __len__(self) -> int:
        return len(self.ops)

    def to_arrow(self) -> pa.Table:
        ends = [start for _, start in self.shapes[1:]] + [len(self.images)]
        if len(self.shapes) == 1:
            data: list[pa.Array | pa.ChunkedArray] = self.decoding.arrays(
                self.shapes[0][0], self.images, self.keys)
        else:
            parts = [self.decoding.arrays(shape, self.images[start:end], self.keys[start:end])
                     for (shape, start), end in zip(self.shapes, ends, strict=True)]
            data = [pa.chunked_array([part[i] for part in parts]) for i in range(len(parts[0]))]
        arrays = [pa.array(self.files, pa.int64()), pa.array(self.positions, pa.int64()),
                  pa.array(self.rows, pa.int64()), pa.array(self.ops, pa.string()), *data]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _write_atomic(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Write a Parquet file under a temporary name and rename it into place."""
    directory, _, name = path.rpartition("/")
    fs.create_dir(directory, recursive=True)
    temp = f"{directory}/.{name}.tmp"
    if isinstance(fs, pafs.LocalFileSystem):
        with open(temp, "wb") as out:
            pq.write_table(table, out)
            out.flush()
            os.fsync(out.fileno())
    else:
        pq.write_table(table, temp, filesystem=fs)
    fs.move(temp, path)


# --------------------------------------------------------------------------- the capture


@dataclass
class _Capture:
    """One capture pass: buffers, segment numbering, checkpoints and progress."""

    store: StateStore
    run_id: str
    fs: pafs.FileSystem
    root: str
    tables: Mapping[str, CaptureTable]
    stop: BinlogPosition
    batch_rows: int
    progress: Callable[[int], None] | None
    segments: int
    rows: dict[str, int]
    buffers: dict[str, _TableBuffer] = field(default_factory=dict)
    buffered: int = 0
    unsaved: bool = False  # segments written since the last checkpoint
    reported: int = 0
    started: float = field(default_factory=time.monotonic)
    last_checkpoint: float = field(default_factory=time.monotonic)
    last_log: float = field(default_factory=time.monotonic)
    captured: int = 0  # changes kept by this call
    starts: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    decoder: Decoder = "fast"

    def __post_init__(self) -> None:
        library = LibraryRows({name: t.info for name, t in self.tables.items()})
        for name, table in self.tables.items():
            key = key_indexes(table)
            decoding: Decoding = FastDecoding(table.info, key, parse_mysql_json) \
                if self.decoder == "fast" else LibraryDecoding(table.info, key, library)
            self.buffers[name] = _TableBuffer(table, decoding)
        self.starts = {name: t.start.key for name, t in self.tables.items()}

    def add(self, event: RowsEvent) -> None:
        file = _file_index(event.file)
        start_file, start_pos, start_row = self.starts[event.table]
        if (file, event.end) < (start_file, start_pos):
            return  # its table's snapshot (or published version) already has these rows
        first = start_row + 1 if (file, event.end) == (start_file, start_pos) else 0
        added = self.buffers[event.table].add(event, file, first)
        self.buffered += added
        self.captured += added
        if self.buffered >= 2 * self.batch_rows:  # a huge transaction: write, checkpoint later
            self.flush()

    def boundary(self, position: BinlogPosition, *, final: bool = False) -> None:
        now = time.monotonic()
        if final or self.unsaved or self.buffered >= self.batch_rows or \
                now - self.last_checkpoint >= CHECKPOINT_SECONDS:
            self.flush()
            self.checkpoint(position)
        if final or now - self.last_log >= LOG_SECONDS:
            self.log_progress(position)

    def flush(self) -> None:
        for name, buffer in self.buffers.items():
            if not len(buffer):
                continue
            self.segments += 1
            path = f"{self.root}/{self.run_id}/changes/{name}/{segment_name(self.segments)}"
            _write_atomic(self.fs, path, buffer.to_arrow())
            self.rows[name] = self.rows.get(name, 0) + len(buffer)
            buffer.clear()
            self.unsaved = True
        self.buffered = 0

    def checkpoint(self, position: BinlogPosition) -> None:
        total = sum(self.rows.values())
        self.store.save_capture_checkpoint(self.run_id, position.to_json(), self.segments, total)
        self.unsaved = False
        self.last_checkpoint = time.monotonic()
        faults.point("capture.checkpoint")
        if self.progress is not None and total > self.reported:
            delta, self.reported = total - self.reported, total
            self.progress(delta)

    def log_progress(self, position: BinlogPosition) -> None:
        self.last_log = now = time.monotonic()
        rate = self.captured / max(now - self.started, 1e-6)
        log.info("capture %s: %d changes (%.0f/s), %d segments, at %s of stop %s", self.run_id,
                 sum(self.rows.values()) + self.buffered, rate, self.segments, position, self.stop)


def _resume_point(store: StateStore, run_id: str, fs: pafs.FileSystem, root: str
                  ) -> tuple[BinlogPosition | None, int, dict[str, int]]:
    """The run's checkpoint (position, segments) and rows per table in durable segments.

    Segments numbered above the checkpoint, and temporary files, are deleted.
    """
    saved = store.capture_checkpoint(run_id)
    position = BinlogPosition.from_json(saved["position"]) if saved else None
    durable = int(saved["segments"]) if saved else 0
    directory = f"{root}/{run_id}/changes"
    rows: dict[str, int] = {}
    for number, table, path in _segments(fs, directory):
        if number > durable:
            log.info("capture %s: deleting %s, written after the last checkpoint", run_id, path)
            fs.delete_file(path)
        else:
            with fs.open_input_file(path) as handle:
                rows[table] = rows.get(table, 0) + pq.read_metadata(handle).num_rows
    for info in fs.get_file_info(pafs.FileSelector(directory, recursive=True, allow_not_found=True)):
        if info.type == pafs.FileType.File and info.base_name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(info.path)
    return position, durable, rows


def capture_changes(config: PipelineConfig, store: StateStore, run_id: str,
                    tables: Mapping[str, CaptureTable], stop: BinlogPosition, *,
                    batch_rows: int = 50_000, progress: Callable[[int], None] | None = None,
                    decoder: Decoder = "fast") -> CaptureResult:
    """Capture the tables' binlog changes up to ``stop`` into the run's staging (resumable).

    Args:
        config: the pipeline (source connection, staging location).
        store: the state store holding the run's capture checkpoint.
        run_id: the run.
        tables: ``{"db.table": CaptureTable}``.
        stop: the high position ``H``, a transaction boundary.
        batch_rows: buffered changes (all tables) that trigger writing segments at the
            next boundary; a transaction bigger than twice this is written in parts.
        progress: called after each checkpoint with the changes written since its last call.
        decoder: ``fast`` (`orchestrator.binlog`) or ``library`` (python-mysql-replication,
            the reference; for tests and benchmarks). Both write the same segments.

    Raises:
        BinlogPurged: the binlog to start from is no longer on the server.
        RunFailed: the binlog connection was lost, or a table's shape changed.
    """
    started = time.monotonic()
    fs, root = _filesystem(config.staging_path)
    checkpoint, segments, rows = _resume_point(store, run_id, fs, root)
    begin = checkpoint or min((t.start for t in tables.values()), default=stop)
    capture = _Capture(store=store, run_id=run_id, fs=fs, root=root, tables=tables, stop=stop,
                       batch_rows=max(1, batch_rows), progress=progress, segments=segments,
                       rows=rows, reported=sum(rows.values()), decoder=decoder)
    if checkpoint is not None:
        log.info("capture %s: resuming from checkpoint %s (%d segments, %d changes)", run_id,
                 checkpoint, segments, sum(rows.values()))
    if begin < stop:
        reader = BinlogReader(config.source, config.resolve_password(), begin,
                              {name: t.info for name, t in tables.items()}, stop=stop)
        with reader:
            _run(capture, reader.events())
    elif checkpoint is None or checkpoint < stop:
        capture.boundary(stop, final=True)
    return CaptureResult(rows={name: capture.rows.get(name, 0) for name in tables},
                         segments=capture.segments, end=stop, resumed=checkpoint is not None,
                         seconds=time.monotonic() - started)


def _run(capture: _Capture, records: Iterable[RowsEvent | Boundary]) -> None:
    """The hot loop: route rows events to the buffers, checkpoint at boundaries."""
    add, boundary = capture.add, capture.boundary
    for record in records:
        if isinstance(record, RowsEvent):
            add(record)
        elif record.kind == "stop":
            boundary(record.position, final=True)
        else:
            boundary(record.position)
