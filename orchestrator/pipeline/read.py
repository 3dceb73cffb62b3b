"""The read step: one batch of chunks between its low and high binlog position.

``L`` is recorded before the reads start and the read margin waited out; the
Spark JDBC job (`orchestrator.pipeline.jdbc`) reads the batch's chunks; ``Hb`` is
recorded after it. A batch whose connection was lost is read again with a fresh ``L``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from orchestrator.config import PipelineConfig
from orchestrator.lake import storage
from orchestrator.pipeline.context import (
    open_source,
    open_store,
    run_dir,
    spark_session,
    table_info,
    take_lock,
)
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.jdbc import read_chunks
from orchestrator.positions import BinlogPosition
from orchestrator.runtime import faults
from orchestrator.schema.tables import TableInfo
from orchestrator.source.retry import read_retry
from orchestrator.state.store import ChunkRecord, StateStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read batch did."""

    batch: int
    table: str
    chunks: int  # chunks read by this call (0 when the batch was already done)
    rows: int
    bytes: int
    low: BinlogPosition | None = None  # L
    high: BinlogPosition | None = None  # Hb

    def __str__(self) -> str:
        if not self.chunks:
            return f"batch {self.batch}: already read"
        return (f"batch {self.batch} ({self.table}, {self.chunks} chunks): {self.rows} rows, "
                f"{self.bytes} bytes, L={self.low} Hb={self.high}")


def read_batch(config: PipelineConfig, run_id: str, batch: int, *, spark: SparkSession | None = None,
               holder: str | None = None) -> ReadResult:
    """Read one batch of chunks between its low and high position (skips done chunks).

    Records ``L`` before the reads start and waits ``read_margin_seconds`` (a
    transaction can reach the binlog a moment before its rows are visible),
    then runs one Spark job for the batch's chunks and records ``Hb`` after it.
    A read that lost its connection is tried again, with a fresh ``L``.
    """
    store = open_store(config)
    try:
        pending = store.chunks(run_id, batch=batch, status="pending")
        if not pending:
            return ReadResult(batch, "", 0, 0, 0)
        table = pending[0].table
        record = next(r for r in store.run_tables(run_id) if r.table == table)
        if record.status == "failed":  # an earlier batch of it failed: the others go on
            return ReadResult(batch, table, 0, 0, 0)
        try:
            return _read_pending(config, store, run_id, batch, pending, table_info(record), spark, holder)
        except Exception as exc:
            reason = table_failure(exc)
            if reason is None:  # a lost source, a full disk...: the run fails, a rerun resumes
                raise
            fail_table(store, run_id, table, "read", reason)
            return ReadResult(batch, table, 0, 0, 0)
    finally:
        store.close()


def _read_pending(config: PipelineConfig, store: StateStore, run_id: str, batch: int,
                  pending: list[ChunkRecord], info: TableInfo, spark: SparkSession | None,
                  holder: str | None) -> ReadResult:
    """`read_batch` of the batch's pending chunks, all of one table."""
    table = pending[0].table
    session = spark or spark_session(config)
    with open_source(config) as source:
        for attempt in read_retry(config.defaults.read_attempts, f"batch {batch} ({table})"):
            with attempt:
                # Chunk dirs unique to this attempt: one the state names is never replaced by
                # another attempt's read (a retry here, or a process that lost the lock).
                tag = storage.attempt_tag()
                paths = {c.index: run_dir(config, run_id, "snapshot", table, f"chunk-{c.index:06d}-{tag}")
                         for c in pending}
                # A retried batch records a fresh L: its reads start again after it.
                low = source.current_position()
                store.mark_batch_started(run_id, batch, low.to_json())
                time.sleep(config.defaults.read_margin_seconds)
                results = read_chunks(session, config, info, [(c.index, c.where) for c in pending],
                                      paths.__getitem__, guard=store.check_fence)
        high = source.current_position()
    for chunk in pending:
        rows, nbytes = results[chunk.index]
        store.mark_chunk_done(run_id, table, chunk.index, high=high.to_json(), rows=rows, bytes=nbytes,
                              path=paths[chunk.index])
    faults.point("read.batch_done")
    if holder:
        take_lock(store, config, holder)
    result = ReadResult(batch, table, len(pending), sum(n for n, _ in results.values()),
                        sum(b for _, b in results.values()), low, high)
    log.info("%s", result)
    return result
