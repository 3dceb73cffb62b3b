"""The state store: what has been planned, read, captured and published.

INTERFACE STUB — the signatures and records below are the contract the engine
codes against; the implementation fills the bodies.

SQLAlchemy 2.x Core or ORM; SQLite by default (WAL, busy timeout), any
SQLAlchemy URL works (PostgreSQL, MySQL). The schema is created on first use
and versioned in a ``tidemark_schema`` table so later versions can migrate.
Positions, key bounds and option dicts are stored as JSON text; the caller
hands in JSON-able values and gets the same values back.

Every method is its own short transaction: a process killed at any point
leaves the store consistent, and each step's result is recorded before the
step returns, so a rerun skips what is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

RunStatus = Literal["running", "failed", "succeeded"]
TableMode = Literal["snapshot", "incremental"]
TableStatus = Literal["planned", "read", "captured", "reconciled", "published"]
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


class StateStore:
    """Args: url: an SQLAlchemy URL, e.g. ``sqlite:////var/lib/tidemark/state.db``."""

    def __init__(self, url: str) -> None: ...

    # --- the pipeline lock: one active run per pipeline -------------------------
    def acquire_lock(self, pipeline: str, holder: str, *, lease_seconds: float = 900) -> None:
        """Take the pipeline's lock for ``holder`` (re-entrant for the same holder).

        Raises RunLocked naming the holder, host, pid and since when, unless the
        current lock is stale: same host and its pid is gone, or not refreshed
        for ``lease_seconds``."""

    def refresh_lock(self, pipeline: str, holder: str) -> None: ...
    def release_lock(self, pipeline: str, holder: str) -> None: ...
    def force_unlock(self, pipeline: str) -> None: ...

    # --- runs ------------------------------------------------------------------
    def unfinished_run(self, pipeline: str) -> RunRecord | None:
        """The pipeline's latest run whose status is running or failed, if any."""

    def create_run(self, pipeline: str, options: dict[str, Any]) -> RunRecord: ...
    def get_run(self, run_id: str) -> RunRecord: ...
    def runs(self, pipeline: str, limit: int = 20) -> list[RunRecord]: ...
    def set_run_positions(self, run_id: str, *, start: dict[str, Any] | None = None,
                          high: dict[str, Any] | None = None) -> None: ...
    def finish_run(self, run_id: str, status: RunStatus, error: str | None = None) -> None: ...

    # --- tables in a run -------------------------------------------------------
    def add_run_table(self, run_id: str, table: str, mode: TableMode, *, strategy: str | None,
                      chunk_key: list[str], info: dict[str, Any]) -> None: ...
    def run_tables(self, run_id: str) -> list[RunTableRecord]: ...
    def set_table_status(self, run_id: str, table: str, status: TableStatus, *,
                         rows: int | None = None, version: int | None = None,
                         info: dict[str, Any] | None = None) -> None: ...

    # --- chunks ----------------------------------------------------------------
    def add_chunks(self, chunks: list[ChunkRecord]) -> None:
        """Insert a table's planned chunks in one transaction."""

    def chunks(self, run_id: str, *, table: str | None = None, batch: int | None = None,
               status: ChunkStatus | None = None) -> list[ChunkRecord]: ...
    def batches(self, run_id: str) -> list[int]: ...
    def mark_batch_started(self, run_id: str, batch: int, low: dict[str, Any]) -> None:
        """Record L for every pending chunk of the batch and count an attempt."""

    def mark_chunk_done(self, run_id: str, table: str, index: int, *, high: dict[str, Any],
                        rows: int, bytes: int, path: str) -> None: ...
    def reset_chunks(self, run_id: str, table: str, indexes: list[int]) -> None:
        """Back to pending (e.g. their L is in a purged binlog)."""

    # --- capture checkpoints ----------------------------------------------------
    def capture_checkpoint(self, run_id: str) -> dict[str, Any] | None:
        """{"position": {...}, "segments": int, "rows": int} or None."""

    def save_capture_checkpoint(self, run_id: str, position: dict[str, Any], segments: int,
                                rows: int) -> None: ...

    # --- table checkpoints (published versions) -----------------------------------
    def table_checkpoint(self, pipeline: str, table: str) -> TableCheckpoint | None: ...
    def table_checkpoints(self, pipeline: str) -> list[TableCheckpoint]: ...
    def save_table_checkpoint(self, checkpoint: TableCheckpoint) -> None: ...

    # --- reset -----------------------------------------------------------------
    def forget(self, pipeline: str, tables: list[str] | None = None, *,
               dry_run: bool = False) -> dict[str, int]:
        """Drop runs/chunks/checkpoints of the pipeline (or only the named tables'
        rows); returns counts per kind of what was (or, dry_run, would be) dropped."""

    def close(self) -> None: ...
