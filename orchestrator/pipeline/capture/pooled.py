"""A table's buffered changes decoded by worker processes (`orchestrator.binlog.pool`).

`PooledBuffer` is `TableBuffer` for a large capture: `add` keeps each rows event's row images
as bytes, and every `JOB_BYTES` of them (or at a new TABLE_MAP shape) goes to the pool as one
job while the capture reads on. `drain` waits for the table's jobs, in order, and assembles the
segment as `TableBuffer.drain` does: the position columns come from the events (each row takes
its event's file, position, op and flags; rows are numbered from the event's ``base + first``),
the other columns from the workers' arrays. Row counts are known only once a job is decoded,
so the capture's "rows buffered" lags by the jobs in flight (`counted`).

A row the workers cannot decode fails its table as the capture's own decoding would
(`DecodeFailed` names the event); the table's later events are dropped with its buffer.

May import: orchestrator, errors, positions, services, schema, chunking, config, state,
lake, source, binlog, pipeline.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from orchestrator.binlog.batch import FastDecoding
from orchestrator.binlog.events import TableMap
from orchestrator.binlog.pool import JOB_BYTES, Decoded, DecodePool, job_of
from orchestrator.binlog.reader import EventReader
from orchestrator.binlog.reference import RowsEvent
from orchestrator.pipeline.capture.buffer import CaptureTable, Drained, TableBuffer
from orchestrator.schema import charsets
from orchestrator.schema.values import staging_type

log = logging.getLogger(__name__)


def start_pool(
    reader: EventReader, decoder: str, pool_bytes: int, run_id: str
) -> DecodePool | None:
    """The worker pool a capture by ``reader`` decodes in: one when the fast decoder is used,
    the machine has more than one core and at least ``pool_bytes`` of binlog are to be read
    (or how much is unknown); else None. Checks the source first (`check_available`)."""
    reader.check_available()
    span = reader.bytes_to_read()
    workers = os.cpu_count() or 1
    if decoder != "fast" or workers < 2 or (span is not None and span < pool_bytes):
        return None
    log.info(
        "capture %s: %s of binlog to read: rows events decoded by %d worker processes",
        run_id,
        "an unknown amount" if span is None else f"{span / 2**20:.0f} MiB",
        workers,
    )
    return DecodePool(workers)


def pooled(buffers: dict[str, TableBuffer], pool: DecodePool) -> dict[str, TableBuffer]:
    """``buffers`` (empty) with those of the fast decoder decoding in ``pool``; a table with text
    in a non-Unicode character set is decoded here, with the server's reading of it that this
    process asked for (`orchestrator.schema.charsets`), which the workers do not have, and so is
    a system-versioned table (`VersionedBuffer`: its rows are picked by their images)."""
    assert not any(len(b) for b in buffers.values()), "no rows buffered yet"
    return {
        name: PooledBuffer(b.table, b.decoding, pool)
        if type(b) is TableBuffer
        and isinstance(b.decoding, FastDecoding)
        and not charsets.used_by([b.table.info])
        else b
        for name, b in buffers.items()
    }


class DecodeFailed(Exception):
    """A rows event whose rows the workers could not decode.

    Attributes:
        cause: what decoding raised.
        file: the binlog file's index.
        end: the event's end position.
    """

    def __init__(self, cause: Exception, file: int, end: int) -> None:
        super().__init__(str(cause))
        self.cause, self.file, self.end = cause, file, end


@dataclass
class _Events:
    """Rows events of one job: where each sits in the binlog, and its row images."""

    table_map: TableMap | None = None
    files: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # each event's first row number
    ops: list[str] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)
    firsts: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    size: int = 0


class PooledBuffer(TableBuffer):
    """`TableBuffer` whose events are decoded by ``pool``."""

    def __init__(self, table: CaptureTable, decoding: FastDecoding, pool: DecodePool) -> None:
        self.pool = pool
        self.fast = decoding  # its `key`: the columns whose before image is decoded
        super().__init__(table, decoding)

    def clear(self) -> None:
        super().clear()
        self.waiting = _Events()
        self.jobs: list[tuple[Future[Decoded], _Events]] = []
        self.known = 0  # rows of the jobs decoded so far
        self.reported = 0  # jobs whose rows `counted` returned

    def add(self, event: RowsEvent, file: int, first: int, base: int = 0) -> int:
        """Keep the event's row images for a job; returns 0 (its rows are counted when its
        job is decoded: `counted`)."""
        waiting = self.waiting
        if waiting.table_map is not None and waiting.table_map.signature != (
            event.table_map.signature
        ):
            self._ship()
            waiting = self.waiting
        waiting.table_map = event.table_map
        waiting.files.append(file)
        waiting.ends.append(event.end)
        waiting.starts.append(base + first)
        waiting.ops.append(event.op)
        waiting.flags.append(event.rows.flags)
        waiting.firsts.append(first)
        body = event.packet[event.rows.start : event.rows.end]
        waiting.bodies.append(body)
        waiting.size += len(body)
        if waiting.size >= JOB_BYTES:
            self._ship()
        return 0

    def _ship(self) -> None:
        waiting = self.waiting
        if not waiting.ops:
            return
        assert waiting.table_map is not None
        job = job_of(
            self.table.info,
            self.fast.key,
            waiting.table_map,
            list(zip(waiting.ops, waiting.bodies, waiting.firsts, strict=True)),
        )
        waiting.bodies = []  # the job holds them now
        self.jobs.append((self.pool.submit(job), waiting))
        self.waiting = _Events()

    def counted(self) -> int:
        """Rows of the jobs decoded since the last call (jobs in order; never waits)."""
        added = 0
        while self.reported < len(self.jobs):
            future, _ = self.jobs[self.reported]
            if not future.done() or future.exception() is not None:
                break
            decoded = future.result()
            added += sum(decoded.counts)
            self.reported += 1
        self.known += added
        return added

    def __len__(self) -> int:
        """Rows known, and one for each event not yet decoded (it may hold none)."""
        pending = sum(len(events.ops) for _, events in self.jobs[self.reported :])
        return self.known + pending + len(self.waiting.ops)

    def first_position(self) -> tuple[int, int] | None:
        for events in [*(e for _, e in self.jobs), self.waiting]:
            if events.ops:
                return events.files[0], events.ends[0]
        return None

    def drain(self) -> Drained:
        """Every job's rows as one `Drained` (waits for the jobs; the buffer is left as it is).

        Raises:
            DecodeFailed: a job failed in an event.
        """
        self._ship()
        meta: list[list[pa.Array]] = [[], [], [], []]
        data: list[list[pa.Array]] = []
        flags: list[Any] = []
        for future, events in self.jobs:
            decoded = future.result()
            if decoded.error is not None:
                if decoded.failed_at is None:
                    raise decoded.error
                at = decoded.failed_at
                raise DecodeFailed(decoded.error, events.files[at], events.ends[at])
            if not decoded.arrays:
                continue
            counts = np.asarray(decoded.counts, np.int64)
            rows = int(counts.sum())
            which = np.repeat(np.arange(len(counts)), counts)
            first_of_event = np.concatenate([[0], np.cumsum(counts)[:-1]])
            numbers = np.asarray(events.starts, np.int64)[which] + (
                np.arange(rows, dtype=np.int64) - first_of_event[which]
            )
            meta[0].append(pa.array(np.asarray(events.files, np.int64)[which]))
            meta[1].append(pa.array(np.asarray(events.ends, np.int64)[which]))
            meta[2].append(pa.array(numbers))
            meta[3].append(pa.array(events.ops, pa.string()).take(pa.array(which)))
            flags.append(np.asarray(events.flags, np.int64)[which])
            data.append(list(decoded.arrays))
        if not data:  # every event's rows were before the table's start
            before = {
                name: pa.array([], staging_type(self.table.info.column(name)))
                for name in self.before_names
            }
            return Drained(self.schema.empty_table(), before, [])
        columns = [pa.chunked_array([part[i] for part in data]) for i in range(len(data[0]))]
        return self.assemble(
            [pa.chunked_array(m) for m in meta],
            columns,
            np.concatenate(flags).tolist(),
        )
