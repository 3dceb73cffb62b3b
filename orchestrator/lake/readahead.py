"""Reading ahead: the published files an incremental run may rewrite, read while it starts.

A `tidemark run` process spends its first half second on one core: the interpreter, the
engine's imports, the state store, preflight and planning, all on the interpreter's lock. An
incremental run's rewrite then reads every base file that holds a changed key, copy-on-write
(docs/output.md), before it merges and writes. `start` reads those files meanwhile, on a thread
of its own: a file whole in one call (Arrow decodes it outside the interpreter's lock), the
last file of each table first (new keys land there), then the others in key order. The
rewrite takes a file's batches (`take`) instead of reading it, and tells which of a table's
files it will read (`settle`): the others are dropped and not read. What is held waits for the
rewrite within `budget` bytes; `stop` ends it all (the run's end, or a step about to fork:
`orchestrator.pipeline.workers`). Measured in docs/performance.md ("What limits each").

Files are immutable and uniquely named (docs/output.md), so a file read ahead is the file the
rewrite would read, whenever it was read. A file that fails to read ahead is left to the
rewrite's own read, which reports what it finds; the reading ahead never fails a run.

Only a process with a second core reads ahead, for at most `MAX_TABLES` tables (a run of
thousands of small tables gains nothing from it), never for a snapshot (it reads no base file),
and nothing when the source's binlog ends where every table's version was taken (``binlog_end``,
asked first: a run with nothing to apply would read for nothing).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.lake import layout, storage

log = logging.getLogger(__name__)

#: Tables whose files a run reads ahead, in the order the run names them.
MAX_TABLES = 8

#: The most decoded bytes held for the rewrite: an eighth of the machine's memory, at most 512
#: MiB (4M rows of the sample's ``shop.orders`` decode to 340 MiB).
BUDGET_BYTES = 512 * 1024 * 1024


def budget() -> int:
    """`BUDGET_BYTES`, or an eighth of the physical memory where that is less."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return BUDGET_BYTES
    return min(BUDGET_BYTES, memory // 8)


@dataclass
class _Held:
    """A file read ahead (or being read): its batches once read (None: not read ahead, the
    rewrite reads it itself); ``wanted``: the rewrite waits for it; ``dropped``: not needed."""

    done: threading.Event = field(default_factory=threading.Event)
    batches: list[pa.RecordBatch] | None = None
    nbytes: int = 0
    wanted: bool = False
    dropped: bool = False


class ReadAhead:
    """The reading ahead of a process (`start`); its methods are safe from any thread."""

    def __init__(
        self,
        table_dirs: Sequence[str],
        limit: int,
        binlog_end: Callable[[], tuple[str, int]] | None = None,
    ) -> None:
        self._dirs = list(table_dirs[:MAX_TABLES])
        self._binlog_end = binlog_end
        self._limit = limit
        self._lock = threading.Condition()
        self._files: dict[str, _Held | None] = {}  # None: the rewrite reads it itself
        self._dropped: set[str] = set()
        self._held = 0
        self._stopped = False
        self.read = self.taken = 0
        self._thread = threading.Thread(target=self._work, name="tidemark-readahead", daemon=True)

    def begin(self) -> ReadAhead:
        """Start the reading thread."""
        self._thread.start()
        return self

    def _work(self) -> None:
        tables = []
        for tdir in self._dirs:
            try:  # read only: a missing manifest is the run's to recover (`manifest.find_manifest`)
                data = storage.read_if_exists(layout.current_uri(tdir))
                if data is not None:
                    manifest = json.loads(data)
                    tables.append((tdir, manifest["files"], _at(manifest.get("position"))))
            except Exception as exc:  # the run reads it again and reports it
                log.debug("reading ahead: no manifest of %s: %s", tdir, exc)
        if tables and self._unmoved({at for _, _, at in tables}):
            return
        for tdir, names, _ in tables:
            files = [storage.join(tdir, name) for name in names]
            for uri in files[-1:] + files[:-1]:
                if not self._read(uri):
                    return

    def _unmoved(self, published: set[tuple[str, int] | None]) -> bool:
        """Whether the source's binlog ends where every table's version was taken (nothing to
        rewrite: the run has no change to apply); False when that is not known."""
        if self._binlog_end is None or len(published) != 1 or None in published:
            return False
        try:
            end = self._binlog_end()
        except Exception as exc:  # the run's own connection reports it
            log.debug("reading ahead: the binlog's end unknown (%s)", type(exc).__name__)
            return False
        return published == {end}

    def _read(self, uri: str) -> bool:
        """Read one file ahead unless the rewrite claimed or dropped it; False once stopped."""
        with self._lock:
            if self._stopped:
                return False
            if uri in self._files or uri in self._dropped:
                return True
            held = _Held()
            self._files[uri] = held
        try:
            with storage.open_parquet(uri) as handle:
                reader = pq.ParquetFile(handle)
                meta = reader.metadata
                size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
                if self._room(held, size):
                    table = reader.read(use_threads=False)
                    held.batches = table.to_batches(max_chunksize=layout.BATCH_ROWS)
                    held.nbytes = table.nbytes
        except Exception as exc:  # the rewrite's own read reports it
            log.debug("reading ahead: %s left to the rewrite: %s", uri, exc)
            held.batches = None
        with self._lock:
            if held.batches is not None:
                self.read += 1
                if held.dropped:
                    held.batches = None
                else:
                    self._held += held.nbytes
            held.done.set()
            return not self._stopped

    def _room(self, held: _Held, size: int) -> bool:
        """Wait until ``size`` more bytes fit in the budget; False when they do not and the
        rewrite waits for this file (it reads it itself: what is held may be what it takes
        after this one), when the file is no longer needed, or once stopped."""
        if size > self._limit:
            return False
        with self._lock:

            def fits() -> bool:
                return self._held + size <= self._limit

            self._lock.wait_for(lambda: self._stopped or held.dropped or held.wanted or fits())
            return not self._stopped and not held.dropped and fits()

    def take(self, uri: str) -> list[pa.RecordBatch] | None:
        """The batches of ``uri`` read ahead (waiting for a read under way), given once; None
        when it was not: then it is never read ahead."""
        with self._lock:
            held = self._files.get(uri)
            self._files[uri] = None
            if held is None:
                return None
            held.wanted = True
            self._lock.notify_all()
        held.done.wait()
        with self._lock:
            batches, held.batches = held.batches, None
            if batches is not None:
                self._held -= held.nbytes
                self.taken += 1
                self._lock.notify_all()
        return batches

    def settle(self, files: Iterable[str], reads: Collection[str]) -> None:
        """Of a table's ``files``, those not among ``reads`` are not needed: dropped, not read."""
        with self._lock:
            for uri in files:
                if uri not in reads:
                    self._dropped.add(uri)
                    self._drop(self._files.pop(uri, None))
            self._lock.notify_all()

    def _drop(self, held: _Held | None) -> None:
        if held is not None:
            held.dropped = True
            if held.batches is not None:
                self._held -= held.nbytes
                held.batches = None

    def stop(self, wait: bool = True) -> None:
        """No more reading ahead: what is held is dropped, and so is a read under way when it
        ends (``wait``: wait for it, as a process about to fork must)."""
        with self._lock:
            self._stopped = True
            for held in self._files.values():
                self._drop(held)
            self._files.clear()
            self._lock.notify_all()
        if wait:
            self._thread.join()
        if self.read:
            log.debug("read ahead %d file(s), %d taken by the rewrite", self.read, self.taken)

    @property
    def held_bytes(self) -> int:
        """The decoded bytes held for the rewrite now."""
        with self._lock:
            return self._held


def _at(position: Any) -> tuple[str, int] | None:
    """A manifest's position as the binlog's (file, offset); None when it has none."""
    try:
        return str(position["file"]), int(position["pos"])
    except (TypeError, KeyError, ValueError):
        return None


_current: ReadAhead | None = None
_current_lock = threading.Lock()


def start(
    table_dirs: Sequence[str],
    limit: int | None = None,
    binlog_end: Callable[[], tuple[str, int]] | None = None,
) -> ReadAhead | None:
    """Start reading ahead the published files of ``table_dirs``' tables (see the module
    docstring); None where it does not (one core, or one is running). ``binlog_end``: where
    the source's binlog ends now (file, offset): when every table's version was taken there,
    nothing was written since and nothing is read."""
    global _current
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with _current_lock:
        if _current is not None or (cores or 1) < 2 or not table_dirs:
            return None
        _current = ReadAhead(table_dirs, budget() if limit is None else limit, binlog_end).begin()
        return _current


def take(uri: str) -> list[pa.RecordBatch] | None:
    """`ReadAhead.take` of the process's reading ahead; None without one."""
    current = _current
    return None if current is None else current.take(uri)


def settle(files: Iterable[str], reads: Collection[str]) -> None:
    """`ReadAhead.settle` of the process's reading ahead, if any."""
    current = _current
    if current is not None:
        current.settle(files, reads)


def stop(wait: bool = True) -> None:
    """End the process's reading ahead, if any (`ReadAhead.stop`)."""
    global _current
    with _current_lock:
        current, _current = _current, None
    if current is not None:
        current.stop(wait)
