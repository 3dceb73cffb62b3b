"""The capture step: record ``H``, capture the binlog up to it
(`orchestrator.pipeline.capture.step.capture_changes`), and re-read inside the run the tables
that need it, capturing again to a new ``H``, until none waits for a re-read."""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.config import PipelineConfig
from orchestrator.pipeline.capture.buffer import CaptureTable, planned_starts
from orchestrator.pipeline.capture.reread import (
    MAX_REREAD_ROUNDS,
    check_binlog_kept,
    give_up_rereads,
    pending_rereads,
    prepare_rereads,
)
from orchestrator.pipeline.capture.step import capture_changes
from orchestrator.pipeline.context import current_run, open_source, open_store, position, table_info
from orchestrator.pipeline.keyless import capture_key, is_keyless
from orchestrator.pipeline.segments import CaptureResult
from orchestrator.source.retry import binlog_retry

log = logging.getLogger("orchestrator.pipeline.capture.step")  # the capture's lines


def capture(
    config: PipelineConfig, run_id: str, *, progress: Callable[[int], None] | None = None
) -> CaptureResult | None:
    """Record ``H`` (once, after every read ended) and capture the binlog up to it.

    A table with a change the binlog cannot apply exactly is re-read inside the run
    (`orchestrator.pipeline.capture.reread`) and the capture goes on to a new ``H``, at most
    `MAX_REREAD_ROUNDS` times. Returns None when every table of the run is already
    captured (a rerun).
    """
    store = open_store(config)
    try:
        current_run(store, config, run_id)
        result = None
        for round_ in range(MAX_REREAD_ROUNDS + 1):
            records = [r for r in store.run_tables(run_id) if r.status == "planned"]
            if not records:
                return result
            pending = pending_rereads(store, run_id)
            if pending and round_ == MAX_REREAD_ROUNDS:
                give_up_rereads(store, run_id, pending)
                break
            with open_source(config) as source:
                check_binlog_kept(store, store.get_run(run_id), records, source.oldest_binlog())
            prepare_rereads(config, store, run_id)
            if pending:  # tables planned again (or failed): their records changed
                records = [r for r in store.run_tables(run_id) if r.status == "planned"]
            stop = position(store.get_run(run_id).high_position)
            tables = {
                r.table: CaptureTable(
                    info=table_info(r),
                    key=capture_key(table_info(r), r.chunk_key),
                    **planned_starts(r.info, r.mode),
                    where=config.table_where(r.table),
                    multiset=is_keyless(r),
                    next_held=bool(r.info.get("next_from")),
                )
                for r in records
            }
            for attempt in binlog_retry():  # each try resumes from the last checkpoint
                with attempt:
                    result = capture_changes(
                        config,
                        store,
                        run_id,
                        tables,
                        stop,
                        batch_rows=config.defaults.capture_batch_rows,
                        progress=progress,
                    )
            log.info("capture: %s", result)
            if not pending_rereads(store, run_id):
                break
        # Failed tables stay failed; each table keeps its own H (a table planned into the run later
        # moves the run's H on). One transaction for every table: a crash leaves all of them to
        # capture.
        store.advance_tables(run_id, "planned", "captured", {"captured_to": stop.to_json()})
        return result
    finally:
        store.close()
