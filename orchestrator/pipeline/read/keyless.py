"""The read of a table without a key: the whole table at one binlog position, by the driver.

Such a table is published as the multiset of its rows and its changes are applied by count
(docs/design.md, "Tables without a key"), so its read must be the table at a known position ``S``
exactly, and its capture starts at ``S``: a change the read saw must not be applied again. One
source connection starts a consistent snapshot and learns its position
(`orchestrator.source.snapshot`: MariaDB's snapshot position; on MySQL a quiet window of the
binlog, tried again until one is quiet or ``source.read_timeout`` has passed, or a brief lock
where the config allows it), then streams the table's rows in that snapshot with the statement
every read uses (`orchestrator.pipeline.read.local.read_rows`). A Spark job cannot share one
transaction across its tasks, so the driver reads. The rows are spilled by their hash and written
as the table's first data files, sorted by hash, one hash range each
(`orchestrator.lake.hashfiles`). The read step records the files and ``S`` with the chunk, in one
transaction (``S`` becomes the table's start position).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from orchestrator.binlog.reader import EventReader, RowsEvent, TableChange, XaEvent
from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.hashfiles import HashBuckets, bucket_count
from orchestrator.lake.layout import FileRange
from orchestrator.pipeline.read.local import read_rows
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo
from orchestrator.source.connection import Source
from orchestrator.source.snapshot import (
    SnapshotMethod,
    begin_locked,
    begin_snapshot,
    begin_window,
    ended,
    how_to_snapshot,
)

log = logging.getLogger(__name__)

#: Seconds between two tries of a quiet window (more: a burst of writes has time to pass).
QUIET_PAUSE = 0.2


@dataclass(frozen=True, slots=True)
class KeylessTable:
    """A table without a key to read: its columns, data file schema, chunk and where it goes."""

    info: TableInfo
    schema: pa.Schema  # the data file schema (`iceberg.data_file_schema`)
    chunk: int  # its one chunk's index
    where: str  # the chunk's predicate (the table's filter, or ``1 = 1``)
    directory: str  # the chunk's directory, unique to the read attempt
    estimated_rows: int | None
    rows_per_file: int  # ``chunk_size``
    lock_allowed: bool  # ``tables[].keyless_lock``


@dataclass(frozen=True, slots=True)
class KeylessRead:
    """What reading a table without a key gave: its files and the position ``S`` they are at."""

    files: list[FileRange]
    start: BinlogPosition
    method: SnapshotMethod
    tries: int

    @property
    def rows(self) -> int:
        return sum(f["rows"] for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f["bytes"] for f in self.files)

    def __str__(self) -> str:
        how = {
            "snapshot": "a consistent snapshot",
            "quiet": f"a consistent snapshot in a quiet binlog window ({self.tries} tries)",
            "lock": "a consistent snapshot begun under a brief read lock",
        }[self.method]
        return (
            f"{self.rows} rows in {len(self.files)} file(s) sorted by row hash, read in {how} "
            f"at {self.start}"
        )


def read_keyless(
    config: PipelineConfig,
    table: KeylessTable,
    guard: Callable[[], None],
    *,
    method: SnapshotMethod | None = None,
) -> KeylessRead:
    """Read ``table`` whole at one binlog position into its data files (module docstring).

    Args:
        config: the pipeline.
        table: the table.
        guard: the fence check, before files are written.
        method: how to take the snapshot; default: what the server offers (`how_to_snapshot`).

    Raises:
        TransientReadError: the connection was lost (the batch is read again).
        RunFailed: the table's own failure: an SQL error, a NULL in a NOT NULL column, no quiet
            binlog window within ``source.read_timeout``, a lock refused.
    """
    name = table.info.name
    with Source.from_pipeline(config, known_good=True) as source:
        chosen = method or how_to_snapshot(source, lock_allowed=table.lock_allowed)
        deadline = time.monotonic() + config.source.read_timeout
        tries = 0
        while True:
            tries += 1
            with ended(source):
                start = _begin(config, source, table, chosen)
                if start is not None:
                    files = _stream(source, table, guard)
                    read = KeylessRead(files, start, chosen, tries)
                    log.info("table %s: %s", name, read)
                    return read
            if time.monotonic() >= deadline:
                raise RunFailed(
                    f"table {name} has no key, and the binlog showed changes of it in each of "
                    f"{tries} windows tried over source.read_timeout "
                    f"({config.source.read_timeout:g} s), so no read of it could be placed at "
                    "one position; run again when it is quieter, or allow a brief read lock "
                    f"while its snapshot starts: keyless_lock: true in its entry"
                )
            time.sleep(QUIET_PAUSE)


def _begin(
    config: PipelineConfig, source: Source, table: KeylessTable, method: SnapshotMethod
) -> BinlogPosition | None:
    """Start the snapshot; the position it is at, or None when a quiet window was not quiet."""
    match method:
        case "snapshot":
            return begin_snapshot(source)
        case "lock":
            with Source.from_pipeline(config, known_good=True) as locker:
                return begin_locked(source, locker, table.info.name)
        case "quiet":
            low, high = begin_window(source, config.defaults.read_margin_seconds)
            changed = _changed_between(config, table.info, low, high)
            if changed:
                log.info(
                    "table %s: %s between %s and %s; the snapshot is tried again",
                    table.info.name,
                    changed,
                    low,
                    high,
                )
                return None
            return high


def _changed_between(
    config: PipelineConfig, info: TableInfo, low: BinlogPosition, high: BinlogPosition
) -> str | None:
    """What the binlog holds of ``info``'s table in ``(low, high]`` (a rows event, a change it
    has no rows for, an XA commit: any may be the table's), or None when nothing."""
    if not low < high:
        return None
    reader = EventReader(
        config.source, config.resolve_password(), low, {info.name: info}, stop=high
    )
    with reader:
        for record in reader.events():
            if isinstance(record, RowsEvent):
                return f"a rows event ending at {record.file}:{record.end}"
            if isinstance(record, TableChange) and info.name in record.tables:
                return f"{record.what} at {record.file}:{record.end}"
            if isinstance(record, XaEvent) and record.kind == "commit":
                return f"an XA COMMIT at {record.file}:{record.end}"
    return None


def _stream(source: Source, table: KeylessTable, guard: Callable[[], None]) -> list[FileRange]:
    """The table's rows in the snapshot begun on ``source``, written as its data files."""
    buckets = bucket_count(table.estimated_rows, table.rows_per_file)
    label = f"{table.info.name} (no key)"
    with HashBuckets(table.schema, buckets, table.rows_per_file) as spilled:
        for rows in read_rows(source, table.info, table.schema, table.where, label):
            spilled.add(rows)
        return spilled.write(
            lambda n: storage.join(table.directory, f"h{n:05d}.parquet"),
            guard,
        )
