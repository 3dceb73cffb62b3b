"""The run's steps, one function each: the CLI and the Airflow DAG call exactly these.

INTERFACE STUB — the engine fills the bodies. Each step is idempotent and
records its result in the state store before it returns, so a retried or
re-run step skips what is done. Steps take the pipeline config and the run id;
they open what they need (source connection, state store, SparkSession)
themselves, so each can run in its own process (an Airflow task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.config import PipelineConfig


@dataclass(frozen=True, slots=True)
class BatchRef:
    """One unit of parallel reading: some chunks of one table, one Spark job."""

    batch: int
    table: str
    chunks: int
    label: str  # e.g. "shop.orders [1, 50001) .. [350001, 400001)" — for map_index_template


@dataclass(frozen=True, slots=True)
class RunHandle:
    run_id: str
    resumed: bool  # True when an unfinished run was picked up instead of a new one
    tables: list[str]  # every table of the run
    snapshot_tables: list[str]  # those being snapshotted (the rest are incremental)
    batches: list[BatchRef]  # batches with chunks still to read


@dataclass(frozen=True, slots=True)
class Published:
    table: str
    uri: str  # the table's output directory (the Airflow Asset URI)
    version: int
    rows: int
    position: dict[str, Any]


def preflight(config: PipelineConfig, tables: list[str] | None = None) -> None:
    """Raise SourceNotReady with every failed check (see orchestrator.doctor)."""
    raise NotImplementedError


def plan(config: PipelineConfig, *, tables: list[str] | None = None, snapshot: bool = False,
         chunk_size: int | None = None, holder: str) -> RunHandle:
    """Resume the pipeline's unfinished run, or start a new one: take the lock for
    ``holder``, record P0, plan the snapshot tables' chunks into batches."""
    raise NotImplementedError


def read_batch(config: PipelineConfig, run_id: str, batch: int) -> dict[str, Any]:
    """Read one batch (skips if already done); returns {"rows", "bytes", "chunks"}."""
    raise NotImplementedError


def capture(config: PipelineConfig, run_id: str) -> dict[str, Any]:
    """Record H (once) and capture the binlog from min(L) / checkpoints up to H."""
    raise NotImplementedError


def reconcile(config: PipelineConfig, run_id: str) -> dict[str, Any]:
    """Per table: snapshot rows + changes -> the table at H (in staging)."""
    raise NotImplementedError


def publish(config: PipelineConfig, run_id: str, *, holder: str) -> list[Published]:
    """Write versions, switch manifests, checkpoint tables, finish the run, release the lock."""
    raise NotImplementedError
