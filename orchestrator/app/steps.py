"""The run's steps, one function each: the CLI and the Airflow DAG call exactly these.

Each step is idempotent and records its result in the state store before it
returns, so a retried or re-run step skips what is done. Steps take the
pipeline config and the run id and open what they need (source connection,
state store, SparkSession) themselves, so each can run in its own process.

Correctness rests on one rule (docs/design.md, "Why it is correct"): the run's
binlog capture starts at ``P0``, recorded before any chunk bound was read and
so before every chunk's low position ``L``; it ends at ``H``, recorded after
every read ended. The last change of a key in ``(P0, H]`` is its state at
``H``; a key without one keeps its snapshot row. Replaying from a position
earlier than a chunk's ``L`` is always safe with full row images, so one start
position serves every chunk.

Each step lives in its own module of `orchestrator.pipeline`; this module is
their one door.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.app.doctor import Preflight
from orchestrator.app.doctor import preflight as _check_source
from orchestrator.config import PipelineConfig
from orchestrator.errors import RunLocked
from orchestrator.pipeline.capture.passes import capture
from orchestrator.pipeline.context import hold_lock, open_store
from orchestrator.pipeline.plan.batches import BatchRef
from orchestrator.pipeline.plan.step import RunHandle, plan, requested_tables
from orchestrator.pipeline.publish.step import Published, publish
from orchestrator.pipeline.read.step import ReadResult, read_batch
from orchestrator.pipeline.reconcile.step import ReconcileResult, reconcile
from orchestrator.pipeline.segments import CaptureResult

__all__ = [
    "BatchRef",
    "CaptureResult",
    "Preflight",
    "ProgressFn",
    "Published",
    "ReadResult",
    "ReconcileResult",
    "RunHandle",
    "capture",
    "fail_run",
    "plan",
    "preflight",
    "publish",
    "read_batch",
    "reconcile",
    "requested_tables",
]

log = logging.getLogger(__name__)

#: Called with (step, done, total, rows) as a step makes progress; the CLI draws bars from it.
ProgressFn = Callable[[str, int, int, int], None]


def preflight(config: PipelineConfig, tables: list[str] | None = None) -> Preflight:
    """Raise SourceNotReady with every failed check (see `orchestrator.app.doctor`); returns
    the tables that failed a check of their own (the run goes on without them) and the
    shapes read, for `plan`. ``tables`` may name pattern entries: all the tables they match."""
    return _check_source(config, tables)


def fail_run(config: PipelineConfig, run_id: str, error: str, *, holder: str | None = None) -> None:
    """Mark a run failed (state kept: the next run resumes it) and release the lock.

    A run that finished ``partial`` (some tables failed on their own, the others published)
    stays so: the next run is a new one that retries those tables. With ``holder``, both
    writes are made under the pipeline lock as that holder (`hold_lock`): when another run
    holds the lock now, the run is its own and is left as it is.
    """
    if holder is None:
        _mark_failed(config, run_id, error, None)
        return
    try:
        with hold_lock(config, holder):
            _mark_failed(config, run_id, error, holder)
    except RunLocked as exc:
        log.warning("run %s is not marked failed: %s", run_id, exc)


def _mark_failed(config: PipelineConfig, run_id: str, error: str, holder: str | None) -> None:
    store = open_store(config)
    try:
        if store.get_run(run_id).status not in ("partial", "succeeded"):
            store.finish_run(run_id, "failed", error=error)
        if holder:
            store.release_lock(config.pipeline, holder)
    finally:
        store.close()
