"""The state store's records: what one row of each ``tm_*`` table means, and how a row becomes one.

``orchestrator.state.store`` re-exports the public names; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Row

RunStatus = Literal["running", "failed", "succeeded", "partial"]  # partial: some tables failed
TableMode = Literal["snapshot", "incremental"]
TableStatus = Literal["planned", "read", "captured", "reconciled", "published", "failed"]
ChunkStatus = Literal["pending", "done"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    pipeline: str
    status: RunStatus
    options: dict[str, Any]  # {"tables": [...], "snapshot": bool, "chunk_size": int|None}
    start_position: dict[str, Any] | None  # P0, BinlogPosition.to_json()
    high_position: dict[str, Any] | None  # H
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True, slots=True)
class RunTableRecord:
    run_id: str
    table: str  # "db.table"
    mode: TableMode
    status: TableStatus
    strategy: str | None
    chunk_key: list[str]
    info: dict[str, Any]  # columns, planning numbers, from_position for incremental, ...
    rows: int | None
    version: int | None


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    run_id: str
    table: str
    index: int  # 0.. within the table
    batch: int  # batch number within the run (a batch spans one table)
    start: Any  # JSON-encoded key bound (list of values) or None = unbounded
    end: Any
    where: str  # SQL predicate for the chunk
    status: ChunkStatus
    low: dict[str, Any] | None  # L, recorded before the batch's reads started
    high: dict[str, Any] | None  # Hb, recorded after they ended
    rows: int | None
    bytes: int | None
    path: str | None
    attempts: int
    #: The chunk's data files as the read wrote them (`layout.FileRange` each), when the read
    #: knew them (the driver's reads; None for Spark's): reconcile need not open the files.
    ranges: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class TableCheckpoint:
    pipeline: str
    table: str
    version: int
    position: dict[str, Any]  # H of the published version
    rows: int
    manifest: str  # path/URI of the version's manifest
    run_id: str
    published_at: datetime


@dataclass(frozen=True, slots=True)
class LockRecord:
    """Who holds a pipeline's lock. ``pid`` is None when the holder asked for lease-only."""

    pipeline: str
    holder: str
    hostname: str
    pid: int | None
    acquired_at: datetime
    refreshed_at: datetime  # the holder's last renewal (a heartbeat, or a fenced write)
    lease_seconds: int  # the holder's lease: taken over once not renewed for this long


@dataclass(frozen=True, slots=True)
class TableProgress:
    """One table of a run, for ``tidemark status``: ``rows_read`` sums the done chunks."""

    run_id: str
    run_status: RunStatus
    table: str
    mode: TableMode
    status: TableStatus
    chunks_done: int
    chunks_total: int
    rows_read: int
    rows: int | None
    version: int | None


# --- rows <-> records ------------------------------------------------------------


def _chunk_rows(chunks: list[ChunkRecord]) -> list[dict[str, Any]]:
    return [
        {
            "run_id": c.run_id,
            "table_name": c.table,
            "chunk_index": c.index,
            "batch_no": c.batch,
            "start_bound": c.start,
            "end_bound": c.end,
            "where_sql": c.where,
            "status": c.status,
            "low_position": c.low,
            "high_position": c.high,
            "row_count": c.rows,
            "byte_count": c.bytes,
            "path": c.path,
            "attempts": c.attempts,
            "file_ranges": c.ranges,
        }
        for c in chunks
    ]


def _run_record(r: Row[Any]) -> RunRecord:
    return RunRecord(
        r.run_id,
        r.pipeline,
        r.status,
        r.options,
        r.start_position,
        r.high_position,
        r.created_at,
        r.updated_at,
        r.finished_at,
        r.error,
    )


def _run_table_record(r: Row[Any]) -> RunTableRecord:
    return RunTableRecord(
        r.run_id,
        r.table_name,
        r.mode,
        r.status,
        r.strategy,
        r.chunk_key,
        r.info,
        r.row_count,
        r.version,
    )


def _chunk_record(r: Row[Any]) -> ChunkRecord:
    return ChunkRecord(
        r.run_id,
        r.table_name,
        r.chunk_index,
        r.batch_no,
        r.start_bound,
        r.end_bound,
        r.where_sql,
        r.status,
        r.low_position,
        r.high_position,
        r.row_count,
        r.byte_count,
        r.path,
        r.attempts,
        r.file_ranges,
    )


def _table_checkpoint(r: Row[Any]) -> TableCheckpoint:
    return TableCheckpoint(
        r.pipeline,
        r.table_name,
        r.version,
        r.position,
        r.row_count,
        r.manifest,
        r.run_id,
        r.published_at,
    )


#: The lease of a lock taken before leases were recorded (schema 1).
LEGACY_LEASE_SECONDS = 900


def _lock_record(r: Row[Any]) -> LockRecord:
    return LockRecord(
        r.pipeline,
        r.holder,
        r.hostname,
        r.pid,
        r.acquired_at,
        r.refreshed_at,
        r.lease_seconds or LEGACY_LEASE_SECONDS,
    )


@dataclass(frozen=True, slots=True)
class TableSetRecord:
    """What a pipeline's table patterns matched when a run was last planned
    (`orchestrator.config.patterns`)."""

    pipeline: str
    run_id: str
    patterns: list[dict[str, Any]]  # PatternMatch.to_json() of each pattern entry
    dropped: list[str]  # published tables a pattern took, no longer at the source
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PlannedTable:
    """One table's plan, for `StateStore.add_run_tables` (many tables in one transaction)."""

    table: str
    mode: TableMode
    strategy: str | None
    chunk_key: list[str]
    info: dict[str, Any]
    chunks: list[ChunkRecord]


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """What reading one chunk gave, for `StateStore.mark_chunks_done`."""

    table: str
    index: int
    rows: int
    bytes: int
    path: str
    ranges: list[dict[str, Any]] | None = None  # `ChunkRecord.ranges`
    #: The position the read is the table at, exactly (a table without a key): it becomes the
    #: table's ``from_position``, where its capture starts.
    start: dict[str, Any] | None = None


def _table_set_record(r: Row[Any]) -> TableSetRecord:
    return TableSetRecord(r.pipeline, r.run_id, r.patterns, r.dropped, r.updated_at)
