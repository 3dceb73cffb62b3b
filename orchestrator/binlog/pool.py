"""Rows events decoded to Arrow in worker processes, while the capture reads on.

Decoding rows events is Python work per row (`orchestrator.binlog.rowdecode`), bound to one
core by the interpreter's lock: a capture of a million changes spent most of its time there
while the machine's other cores idled. A large capture (`POOL_BYTES` of binlog or more) hands
its rows events to a `DecodePool` instead: the capture keeps reading and framing the stream, and
each batch of one table's events (`Job`, one TABLE_MAP shape) is decoded and turned into the
staging Arrow arrays by another process, with the same `FastDecoding` the capture uses itself,
so the arrays are the same value for value (tests/unit/test_decode_pool.py,
tests/integration/test_binlog_fast.py).

The workers are plain ``python -m orchestrator.binlog.worker`` processes talking over their
standard input and output (pickled jobs and results, each prefixed by its length): no
``multiprocessing`` start method, so no parent's ``__main__`` is imported again (an Airflow
task's, say) and nothing of the parent (connections, locks, threads) is inherited. They get
no secret: only row bytes, the table's planned shape and its TABLE_MAP. One thread per worker
feeds it; results are taken in the order jobs were given. A worker that dies fails the
capture (`DecodeWorkerLost`), which a rerun resumes from its last checkpoint.

May import: orchestrator, errors, positions, services, schema, chunking, config, state,
lake, source.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, Self

import pyarrow as pa

from orchestrator.binlog.batch import FastDecoding
from orchestrator.binlog.events import RowsLayout, TableMap
from orchestrator.binlog.jsonb import json_text
from orchestrator.errors import RunFailed
from orchestrator.schema.tables import TableInfo
from orchestrator.services import faults

#: A capture reading at least this many bytes of binlog decodes in worker processes (smaller
#: ones would spend more on starting them than they save: about 0.4 CPU s a worker).
POOL_BYTES = 64 << 20

#: Rows-event bytes a job holds at most (about 20,000 changes of a 10-column table).
JOB_BYTES = 2 << 20

_LENGTH = struct.Struct("<Q")


class DecodeWorkerLost(RunFailed):
    """A decoding worker process ended before answering (killed, out of memory)."""


@dataclass(frozen=True, slots=True)
class Job:
    """Consecutive rows events of one table under one TABLE_MAP shape, undecoded.

    Attributes:
        info: the table as planned.
        key: the indexes of the columns whose before image is decoded (`FastDecoding`).
        table_map: the TABLE_MAP the events refer to.
        ops: each event's ``I``, ``U`` or ``D``.
        sizes: the length of each event's row images in ``body``.
        firsts: the index of each event's first row to keep.
        body: the events' row images, back to back.
    """

    info: TableInfo
    key: tuple[int, ...]
    table_map: TableMap
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    firsts: tuple[int, ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Decoded:
    """A job's rows: how many each event gave (after its ``first``) and the arrays
    `FastDecoding.arrays` makes of them; or where decoding failed.

    Attributes:
        counts: rows per event.
        arrays: the table's columns, then the old-key columns (empty when failed).
        error: the exception decoding raised, None when it did not.
        failed_at: the index of the event it failed in; None when the conversion to Arrow
            failed (no single event is to blame).
    """

    counts: tuple[int, ...]
    arrays: tuple[pa.Array, ...]
    error: Exception | None = None
    failed_at: int | None = None


class _Event:
    """What `FastDecoding.rows` reads of a rows event (`orchestrator.binlog.reader.RowsEvent`)."""

    __slots__ = ("op", "packet", "rows", "table_map")

    def __init__(self, op: str, packet: bytes, rows: RowsLayout, table_map: TableMap) -> None:
        self.op, self.packet, self.rows, self.table_map = op, packet, rows, table_map


def decode(job: Job, decodings: dict[bytes, FastDecoding] | None = None) -> Decoded:
    """Decode a job as the capture would (``decodings``: kept across jobs, by table shape)."""
    cache = {} if decodings is None else decodings
    name = pickle.dumps((job.info, job.key))
    decoding = cache.get(name)
    if decoding is None:
        decoding = cache[name] = FastDecoding(job.info, job.key, json_text)
    counts: list[int] = []
    images: list[Any] = []
    keys: list[Any] = []
    shape: Any = None
    offset = 0
    columns = len(job.info.columns)
    for index, (op, size, first) in enumerate(zip(job.ops, job.sizes, job.firsts, strict=True)):
        event = _Event(
            op, job.body, RowsLayout(columns, True, offset, offset + size), job.table_map
        )
        offset += size
        try:
            shape, rows, old = decoding.rows(event)  # type: ignore[arg-type]
        except Exception as exc:
            return Decoded(tuple(counts), (), _portable(exc), index)
        if first:
            rows, old = rows[first:], old[first:]
        counts.append(len(rows))
        images += rows
        keys += old
    if not images:
        return Decoded(tuple(counts), ())
    try:
        arrays = decoding.arrays(shape, images, keys)
    except Exception as exc:
        return Decoded(tuple(counts), (), _portable(exc))
    return Decoded(tuple(counts), tuple(arrays))


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling, else a `RunFailed` with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RunFailed(f"{type(exc).__name__}: {exc}")
    return exc


def _encode(payload: Any) -> bytes:
    return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)


def _write(out: IO[bytes], data: bytes) -> None:
    """``data`` (`_encode`'s), prefixed by its length."""
    out.write(_LENGTH.pack(len(data)))
    out.write(data)
    out.flush()


def _receive(source: IO[bytes]) -> Any:
    head = source.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    size = _LENGTH.unpack(head)[0]
    data = source.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class DecodePool:
    """Worker processes decoding `Job`s; `submit` gives a future of the `Decoded`.

    At most two jobs per worker are in flight: `submit` waits for one to end beyond that, so
    memory stays bounded however far the capture reads ahead.
    """

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        env = dict(os.environ)
        # the workers import Tidemark from where this process did
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self._processes = [
            subprocess.Popen(
                [sys.executable, "-m", "orchestrator.binlog.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for _ in range(self.workers)
        ]
        self._idle: queue.SimpleQueue[subprocess.Popen[bytes]] = queue.SimpleQueue()
        for process in self._processes:
            self._idle.put(process)
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="tidemark-decode")
        self._slots = threading.BoundedSemaphore(2 * self.workers)
        self._broken: DecodeWorkerLost | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(kill=exc is not None)

    def submit(self, job: Job) -> Future[Decoded]:
        self._slots.acquire()
        try:
            future = self._threads.submit(self._run, job)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def _run(self, job: Job) -> Decoded:
        data = _encode(job)  # may fail: nothing sent
        process = self._idle.get()
        try:
            if self._broken is not None:
                raise self._broken
            assert process.stdin is not None and process.stdout is not None
            try:
                _write(process.stdin, data)
                decoded = _receive(process.stdout)
            except BaseException as exc:  # the worker's pipes are out of step now
                code = process.poll()
                if code is None and isinstance(exc, EOFError | OSError):  # it is ending
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        code = process.wait(timeout=5)
                self._broken = DecodeWorkerLost(
                    f"a binlog decoding worker (pid {process.pid}) "
                    + (f"ended with exit code {code}" if code is not None else f"failed: {exc!r}")
                    + "; the capture resumes from its last checkpoint when the run is retried"
                )
                raise self._broken from exc
        finally:  # back in the queue even when broken: the next job then fails at once
            self._idle.put(process)
        assert isinstance(decoded, Decoded)
        return decoded

    def close(self, *, kill: bool = False) -> None:
        """Stop the workers: let them finish (they end at the end of their input), or kill them."""
        self._threads.shutdown(wait=not kill, cancel_futures=kill)
        for process in self._processes:
            if kill:
                process.kill()
            elif process.stdin is not None:
                with contextlib.suppress(OSError):  # already broken: it ended
                    process.stdin.close()
        for process in self._processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()


def worker(source: IO[bytes], out: IO[bytes]) -> None:
    """A worker's loop: a `Decoded` for every `Job`, until its input ends."""
    decodings: dict[bytes, FastDecoding] = {}
    while True:
        try:
            job = _receive(source)
        except EOFError:
            return
        faults.point("decode.job")
        _write(out, _encode(decode(job, decodings)))


def job_of(
    info: TableInfo,
    key: Sequence[int],
    table_map: TableMap,
    events: Sequence[tuple[str, bytes, int]],
) -> Job:
    """A job of ``events``: (op, row images, first row kept) each."""
    return Job(
        info,
        tuple(key),
        table_map,
        tuple(op for op, _, _ in events),
        tuple(len(body) for _, body, _ in events),
        tuple(first for _, _, first in events),
        b"".join(body for _, body, _ in events),
    )


def main() -> None:
    """A worker process: results go to a copy of the standard output; anything else printed
    goes to the error stream."""
    results = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    worker(sys.stdin.buffer, results)
