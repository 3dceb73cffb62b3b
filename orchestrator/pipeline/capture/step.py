"""Capture: the run's binlog row changes, up to the high position ``H``, into staging Parquet.

One pass over the binlog from the lowest start position (or the run's capture checkpoint) to
``stop``, keeping the changes of the run's tables, each only when after that table's start.
Changes are buffered per table and written as numbered segments, tagged by capture attempt::

    <staging>/<run_id>/changes/<db>.<table>/seg-000001-<writer>.parquet

with columns ``_tm_file, _tm_pos, _tm_row`` (the change's binlog position),
``_tm_op`` (``I``/``U``/``D``), every table column in its staging type (the
after image; for a delete the before image), then ``_tm_old_<c>`` for each
chunk-key column (the before-image key of updates and deletes).

Segment numbers run across the whole run. After the buffers are written at a
transaction boundary, the checkpoint records that boundary, the highest
segment number and which attempt wrote which numbers: the durable segments hold
every kept change up to the boundary and nothing after it. A resumed capture
reads on from the boundary under a new tag and numbers on from the checkpoint's
count; segments an earlier attempt wrote after its last checkpoint carry that
attempt's tag and are never read (`orchestrator.pipeline.segments`), so every
change lands in exactly one durable segment. Every checkpoint is a fenced write
and segments are written only after the fence is checked: a capture whose pipeline
lock was taken over stops (`LockLost`) before it writes anything more.

Rows events arrive undecoded (`orchestrator.binlog.reference.BinlogReader.events`); only
the run's tables' are kept, and rows at or before a table's start are dropped a
whole event at a time where they can be. Each table's events are decoded by
`orchestrator.binlog.batch.FastDecoding` into tuples of raw values, which
become Arrow column by column when a segment is written; ``decoder="library"``
decodes with python-mysql-replication instead (the reference, for tests and
benchmarks), into the same segments; it gives NULL for a date the server kept under
``ALLOW_INVALID_DATES``, which the fast decoder rolls over as the snapshot does.
A capture of `POOL_BYTES` of binlog or more decodes in worker processes instead
(`orchestrator.binlog.pool`, `orchestrator.pipeline.capture.pooled`): the same decoder,
the same segments, while this process reads on.

A row's number (``_tm_row``) is its index in its event; the k-th event at a shared position
(a MySQL compressed transaction's, an XA's commit) numbers from ``k * SHARED_ROWS``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pyarrow.fs as pafs

from orchestrator.binlog import versioned
from orchestrator.binlog.batch import Decoding, FastDecoding
from orchestrator.binlog.jsonb import json_text
from orchestrator.binlog.pool import POOL_BYTES, DecodeWorkerLost
from orchestrator.binlog.reference import (
    BinlogReader,
    Boundary,
    LibraryDecoding,
    LibraryRows,
    RowsEvent,
    TableChange,
    XaEvent,
)
from orchestrator.config import PipelineConfig
from orchestrator.lake import storage
from orchestrator.pipeline.capture.buffer import (
    NEVER,
    CaptureTable,
    Drained,
    TableBuffer,
    VersionedBuffer,
    before_indexes,
    since,
)
from orchestrator.pipeline.capture.cascade_setup import RunCascades, run_cascades, with_before
from orchestrator.pipeline.capture.derive import Cascades, Reread
from orchestrator.pipeline.capture.filtering import ChangeFilters
from orchestrator.pipeline.capture.pooled import DecodeFailed, pooled, start_pool
from orchestrator.pipeline.capture.reread import (
    stopped,
)
from orchestrator.pipeline.capture.writes import Segments, SegmentWrites
from orchestrator.pipeline.capture.xa import XaTransactions, xid_text
from orchestrator.pipeline.context import open_source
from orchestrator.pipeline.failed import fail_table, mark_reread, table_failure
from orchestrator.pipeline.segments import (
    CaptureResult,
    forget,
    resume_point,
    segment_name,
)
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.schema import charsets
from orchestrator.schema.tables import TableInfo
from orchestrator.services import faults
from orchestrator.state.store import StateStore

log = logging.getLogger(__name__)

#: Checkpoint at a boundary at least this often, even with little to write.
CHECKPOINT_SECONDS = 30.0
#: Log a progress line at most this often.
LOG_SECONDS = 10.0

_file_index = functools.lru_cache(maxsize=256)(file_index)
_NEVER = NEVER

#: Row numbers an event sharing its position with earlier ones starts from, per earlier event
#: (more than a rows event of up to 4 GiB can hold).
SHARED_ROWS = 1 << 32

#: How rows events are decoded: Tidemark's own decoder, or python-mysql-replication's.
Decoder = Literal["fast", "library"]


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
    # [writer, first segment], checkpointed; this attempt's tag in its segment names
    owners: list[list[object]] = field(default_factory=list)
    writer: str = field(default_factory=storage.attempt_tag)
    buffers: dict[str, TableBuffer] = field(default_factory=dict)
    buffered: int = 0
    unsaved: bool = False  # segments written since the last checkpoint
    reported: int = 0
    started: float = field(default_factory=time.monotonic)
    last_checkpoint: float = field(default_factory=time.monotonic)
    last_log: float = field(default_factory=time.monotonic)
    captured: int = 0  # changes kept by this call
    starts: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    xa: XaTransactions = field(default_factory=XaTransactions)

    decoder: Decoder = "fast"
    filters: ChangeFilters = field(default_factory=ChangeFilters)
    run_cascades: RunCascades | None = None
    staging: str = ""  # the staging URI ``root`` is the path of (segments read back)
    cascades: Cascades | None = None
    files: dict[int, str] = field(default_factory=dict)  # file index -> binlog file name
    writes: SegmentWrites = field(init=False)  # segments written while the capture reads on

    def __post_init__(self) -> None:
        self.writes = SegmentWrites(self.fs)
        captured = dict(self.tables)
        if self.run_cascades is not None:  # parents outside the run: decoded for the cascades
            captured = with_before(
                {**captured, **self.run_cascades.outside}, self.run_cascades.keys
            )
        # the reference decoder's per-table set-up only where it decodes (a run of 2,000 tables
        # spent a tenth of its capture building it for nothing)
        library = (
            None
            if self.decoder == "fast"
            else LibraryRows({name: t.info for name, t in captured.items()})
        )
        for name, table in captured.items():
            key = before_indexes(table)
            if library is None and versioned.applied(versioned.logged(table.info)):
                logged = FastDecoding(versioned.logged(table.info), key, json_text)
                self.buffers[name] = VersionedBuffer(table, logged)
                continue
            decoding: Decoding = (
                FastDecoding(table.info, key, json_text)
                if library is None
                else LibraryDecoding(table.info, key, library)
            )
            self.buffers[name] = TableBuffer(table, decoding)
        self.starts = {name: t.start.key for name, t in captured.items()}
        if self.run_cascades is not None:
            cascades = self.run_cascades
            self.cascades = Cascades(
                cascades.keys, captured, self.starts, cascades.bases, cascades.segments, self.reread
            )
            begin = min(self.starts.values())
            for name in self.cascades.as_parent:  # its rows before its own start still cascade
                if name in self.starts:
                    self.starts[name] = min(self.starts[name], begin)

    def add(self, event: RowsEvent, base: int = 0) -> None:
        """Buffer the event's rows, numbered from ``base`` at its position (`SHARED_ROWS`)."""
        if self.xa.group is not None and self.xa.take(event):
            return
        file = _file_index(event.file)
        self.files[file] = event.file
        start_file, start_pos, start_row = self.starts[event.table]
        if (file, event.end) < (start_file, start_pos):
            return  # its table's snapshot (or published version) already has these rows
        # rows numbered up to the start's row are in the snapshot (or version) already
        first = max(0, start_row + 1 - base) if (file, event.end) == (start_file, start_pos) else 0
        buffer = self.buffers[event.table]
        try:  # a value that cannot be decoded: recorded before any checkpoint past it
            added = buffer.add(event, file, first, base) + buffer.counted()
        except Exception as exc:
            self.fail(
                event.table,
                exc,
                f"rows event ending at {event.file}:{event.end}",
                (file, event.end),
            )
            return
        self.buffered += added
        self.captured += added
        if self.buffered >= 2 * self.batch_rows:  # a huge transaction: write, checkpoint later
            self.flush()

    def fail(
        self, table: str, exc: Exception, where: str, at: tuple[int, int] | None = None
    ) -> None:
        """``exc`` is the table's own failure (else it is raised): record it, drop the table's
        buffered rows and keep none of its rows after. ``at``: the failing event's position. The
        run tables its rows cascade into are re-read from its first row lost."""
        if (reason := table_failure(exc)) is None:
            raise exc
        if table in self.tables:
            fail_table(self.store, self.run_id, table, "capture", f"{reason} ({where})")
        buffer = self.buffers[table]
        lost = buffer.first_position() or at
        buffer.clear()
        self.starts[table] = _NEVER
        if self.cascades is not None and table in self.cascades.as_parent and lost is not None:
            below = frozenset(self.cascades.below(table, (*lost, 0), every=True))
            if below:  # its rows cascade into them, and they are no longer known
                what = f"{table}, whose rows cascade into it, failed ({reason})"
                change = TableChange(below, what, self.files.get(lost[0], ""), lost[1])
                self.change(change, (*lost, 0), below)

    def reread(self, reread: Reread) -> None:
        """Tables the cascade derivation re-reads (`orchestrator.pipeline.capture.derive`)."""
        self.change(
            TableChange(reread.tables, reread.what, self.files.get(reread.file, ""), reread.pos),
            (reread.file, reread.pos, 0),
        )

    def xa_step(self, record: XaEvent) -> None:
        """An XA step: a committed transaction's rows are added at the commit's position."""
        committed = self.xa.step(record)
        if committed is None:  # tables whose start knew it have nothing of it (`XA_KNOWN`)
            xid = xid_text(record.xid)
            unknown = frozenset(t for t, table in self.tables.items() if xid not in table.known)
            what = "XA COMMIT of a transaction prepared before this capture began"
            self.change(TableChange(unknown, what, record.file, record.end))
            return
        for number, event in enumerate(committed):  # all at the commit's position
            if isinstance(event, TableChange):  # its rows changed now: re-read from here
                self.change(event)
            else:
                self.add(event, number * SHARED_ROWS)

    def change(
        self,
        change: TableChange,
        where: tuple[int, int, int] | None = None,
        whole: frozenset[str] = frozenset(),
    ) -> None:
        """A change the binlog has no row images of: record the re-read, keep no more rows.

        Recorded before any checkpoint past it, so a resumed capture still re-reads. The run
        tables its rows cascade into are re-read with it (`reread.stopped`; ``whole``: re-read
        whatever their start). ``where``: the change's position as a key, when it is not
        ``change``'s own.
        """
        key = where or (_file_index(change.file), change.end, 0)
        for table in stopped(change.tables, key, self.tables, self.starts, self.cascades, whole):
            self.starts[table] = _NEVER
            if table not in self.tables:  # a parent outside the run: nothing to re-read
                continue
            log.warning(
                "table %s: %s at %s: re-read",
                table,
                change.what,
                change.position if where is None else f"{self.files.get(key[0])}:{key[1]}",
            )
            position = (
                change.position
                if where is None
                else BinlogPosition(self.files.get(key[0], change.file), key[1])
            )
            mark_reread(self.store, self.run_id, table, change.what, position)

    def boundary(self, position: BinlogPosition, *, final: bool = False) -> None:
        now = time.monotonic()
        if (
            final
            or self.unsaved
            or self.buffered >= self.batch_rows
            or now - self.last_checkpoint >= CHECKPOINT_SECONDS
        ):
            self.flush()
            if final:
                self.hold_prepared(position)
            self.checkpoint(position)
        if final or now - self.last_log >= LOG_SECONDS:
            self.log_progress(position)

    def hold_prepared(self, stop: BinlogPosition) -> None:
        """The tables' next starts held back for XA transactions prepared but not committed at
        ``stop`` (`orchestrator.pipeline.capture.xa`). A table that failed, or waits for a
        re-read, keeps no rows: it is not held (its status stays)."""
        live = {
            table: (t.first, t.held)
            for table, t in self.tables.items()
            if self.starts[table] != _NEVER
        }
        holds = self.xa.holds(live, stop, {t: self.tables[t].known for t in live})
        infos: dict[str, dict[str, Any]] = {  # held by an earlier pass: not any more
            table: {"next_from": None} for table in live if self.tables[table].next_held
        }
        infos.update({t: {"next_from": at} for t, at in holds.next_starts(stop).items()})
        self.store.merge_tables_info(self.run_id, infos)  # one transaction for thousands

    def flush(self) -> None:
        if not any(len(buffer) for buffer in self.buffers.values()):
            self.buffered = 0
            return
        self.store.check_fence()  # a capture that lost the pipeline lock writes nothing more
        if not self.owners or self.owners[-1][0] != self.writer:
            self.owners.append([self.writer, self.segments + 1])
        drained: dict[str, Drained] = {}
        for name, buffer in self.buffers.items():
            if not len(buffer):
                continue
            try:  # values are converted here: one that cannot be fails its table alone, as in `add`
                drained[name] = buffer.drain()
            except DecodeWorkerLost:  # the run's failure, not the table's
                raise
            except DecodeFailed as exc:  # a worker's (`PooledBuffer`), in the event it names
                where = f"rows event ending at {self.files.get(exc.file, exc.file)}:{exc.end}"
                self.fail(name, exc.cause, where, (exc.file, exc.end))
            except Exception as exc:
                self.fail(name, exc, f"rows events before {self.stop}", None)
        if self.cascades is not None:  # the derivation may read back segments written before
            self.writes.wait()
        derived = self.cascades.process(drained) if self.cascades is not None else {}
        written: Segments = []
        for name in self.buffers.keys() & (drained.keys() | derived.keys()):
            own = drained[name].table if name in drained else None
            if name not in self.tables or self.starts[name] == _NEVER:
                self.buffers[name].clear()  # a parent outside the run, or re-read from here
                continue
            early = self.cascades is not None and name in self.cascades.as_parent
            changes = since(own, self.tables[name].start.key if early else None, derived.get(name))
            try:
                changes = self.filters.apply(name, changes)
            except Exception as exc:
                self.fail(name, exc, f"rows events before {self.stop}", None)
                continue
            self.segments += 1
            file = segment_name(self.segments, self.writer)
            written.append((f"{self.root}/{self.run_id}/changes/{name}/{file}", changes))
            self.rows[name] = self.rows.get(name, 0) + changes.num_rows
            if self.cascades is not None:
                uri = storage.join(self.staging, self.run_id, "changes", name, file)
                self.cascades.written(name, uri)
            self.buffers[name].clear()
            self.unsaved = True
        self.writes.submit(written)  # `capture.flushed` once written
        self.buffered = 0

    def checkpoint(self, position: BinlogPosition) -> None:
        self.writes.wait()  # the segments it names are written
        hold = self.xa.hold()
        if hold is not None and hold < position:  # a prepared XA transaction's rows are held
            position = hold
        total = sum(self.rows.values())
        self.store.save_capture_checkpoint(
            self.run_id,
            {**position.to_json(), **self.xa.outcomes()},
            self.segments,
            total,
            [o for o in self.owners if int(str(o[1])) <= self.segments],
        )
        self.unsaved = False
        self.last_checkpoint = time.monotonic()
        faults.point("capture.checkpoint")
        if self.progress is not None and total > self.reported:
            delta, self.reported = total - self.reported, total
            self.progress(delta)

    def log_progress(self, position: BinlogPosition) -> None:
        self.last_log = now = time.monotonic()
        rate = self.captured / max(now - self.started, 1e-6)
        log.info(
            "capture %s: %d changes (%.0f/s), %d segments, at %s of stop %s",
            self.run_id,
            sum(self.rows.values()) + self.buffered,
            rate,
            self.segments,
            position,
            self.stop,
        )


def _logged(info: TableInfo, decoder: Decoder) -> TableInfo:
    """The shape the reader checks a table's TABLE_MAPs against: a system-versioned table's
    rows events as its `VersionedBuffer` applies them (Tidemark's decoder only: with the
    reference decoder such a table is re-read)."""
    if decoder == "fast":
        return versioned.logged(info)
    return replace(info, row_end=None) if info.versioned else info


def _load_charsets(config: PipelineConfig, infos: Sequence[TableInfo]) -> None:
    """The server's reading of the non-Unicode character sets the tables' text is in
    (`orchestrator.schema.charsets`), asked once a process, over a connection opened only when
    one is not known yet."""
    wanted = charsets.missing(charsets.used_by(infos))
    if not wanted:
        return
    with open_source(config) as source:
        failed = charsets.load(source, wanted)
    for charset, why in sorted(failed.items()):
        log.warning("character set %s: %s; its tables fail at their first change", charset, why)


def capture_changes(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    tables: Mapping[str, CaptureTable],
    stop: BinlogPosition,
    *,
    batch_rows: int = 50_000,
    progress: Callable[[int], None] | None = None,
    decoder: Decoder = "fast",
    pool_bytes: int = POOL_BYTES,
) -> CaptureResult:
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
        decoder: ``fast`` (`orchestrator.binlog`) or ``library`` (python-mysql-replication, the
            reference, for tests and benchmarks); both write the same segments.
        pool_bytes: the binlog bytes to read from which the fast decoder runs in worker
            processes (`orchestrator.binlog.pool`; where the machine has more than one core).

    Raises:
        BinlogPurged: the binlog to start from is no longer on the server.
        RunFailed: the binlog connection was lost.
    """
    started = time.monotonic()
    forget()  # segments an earlier capture of this process kept, and left unread
    fs, root = storage.filesystem(config.staging_path)
    checkpoint, segments, rows, owners = resume_point(store, run_id, fs, root)
    begin = checkpoint or min((t.first for t in tables.values()), default=stop)
    cascades = run_cascades(config, store, run_id, tables)
    if cascades is not None:
        tables = with_before(tables, cascades.keys)
    outside = cascades.outside if cascades is not None else {}
    _load_charsets(config, [t.info for t in (*tables.values(), *outside.values())])
    capture = _Capture(
        store=store,
        run_id=run_id,
        fs=fs,
        root=root,
        tables=tables,
        stop=stop,
        batch_rows=max(1, batch_rows),
        progress=progress,
        segments=segments,
        rows=rows,
        owners=[list(o) for o in owners],
        reported=sum(rows.values()),
        decoder=decoder,
        filters=ChangeFilters(tables, lambda: open_source(config)),
        run_cascades=cascades,
        staging=config.staging_path,
        xa=XaTransactions(
            frozenset().union(*(t.known for t in tables.values())),
            (store.capture_checkpoint(run_id) or {}).get("position") if checkpoint else None,
        ),
    )
    if checkpoint is not None:
        log.info(
            "capture %s: resuming from checkpoint %s (%d segments, %d changes)",
            run_id,
            checkpoint,
            segments,
            sum(rows.values()),
        )
    if begin < stop:
        faults.point("capture.reading")
        read = {**tables, **(cascades.outside if cascades is not None else {})}
        reader = BinlogReader(
            config.source,
            config.resolve_password(),
            begin,
            {name: _logged(t.info, decoder) for name, t in read.items()},
            stop=stop,
        )
        with reader, capture.filters, ExitStack() as stack:
            pool = start_pool(reader, decoder, pool_bytes, run_id)
            if pool is not None:
                capture.buffers = pooled(capture.buffers, stack.enter_context(pool))
            _run(capture, reader.events())
    else:  # nothing to read (a pass after re-reads that left H): the next starts decided again
        capture.boundary(stop, final=True)
    return CaptureResult(
        rows={name: capture.rows.get(name, 0) for name in tables},
        segments=capture.segments,
        end=stop,
        resumed=checkpoint is not None,
        seconds=time.monotonic() - started,
    )


def _run(
    capture: _Capture, records: Iterable[RowsEvent | Boundary | TableChange | XaEvent]
) -> None:
    """The hot loop: route rows events to the buffers, checkpoint at boundaries."""
    add, boundary = capture.add, capture.boundary
    # Rows events that share a position (a MySQL compressed transaction's, all at the payload's
    # end) number their rows on, in binlog order: the last change of a key stays the last.
    at: tuple[str, int] | None = None
    number = 0
    for record in records:
        if isinstance(record, RowsEvent):
            if (record.file, record.end) != at:
                at, number = (record.file, record.end), 0
            else:
                number += 1
            add(record, number * SHARED_ROWS)
        elif isinstance(record, TableChange):
            if not capture.xa.take(record):  # an XA transaction's takes effect at its commit
                capture.change(record)
        elif isinstance(record, XaEvent):
            capture.xa_step(record)
        elif record.kind == "stop":
            boundary(record.position, final=True)
        else:
            boundary(record.position)
