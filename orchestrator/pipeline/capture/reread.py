"""Re-reading a table inside the run: what the binlog cannot give exactly, the source can.

A TRUNCATE, any DDL, a statement-format change and an unparseable statement naming
a run's table carry no row images, and a TABLE_MAP of another shape has rows the
planned decoder cannot read. The capture records each such change on the table
(``reread_pending``: what and where) before it checkpoints past it, then stops
keeping the table's rows. After the pass, `prepare_rereads`:

1. plans the table again as a snapshot from ``P0_T``, the source's position now
   (recorded before any key bound is read, as ``P0`` is) - `plan.replan_snapshot` -
   and, in the same transaction, voids its change segments of the run (rows of before
   the change; `orchestrator.pipeline.segments`);
2. reads its new chunks (`read.read_batch`: ``L``, read, ``Hb``);
3. moves the run's ``H`` past every chunk's ``Hb``.

The capture then goes on from its checkpoint to the new ``H`` for every table, the
re-read one from ``P0_T``: that table becomes a snapshot taken inside the run, exact
by the same rule as any snapshot. Each step is recorded before the next, so a crash
anywhere resumes: a pending change is re-read again (segments voided, plan
replaced), unread chunks of a re-read table are read, and ``H`` is moved again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from orchestrator.config import PipelineConfig
from orchestrator.errors import BinlogPurged, RunFailed
from orchestrator.pipeline.capture.buffer import NEVER, CaptureTable
from orchestrator.pipeline.capture.derive import At, Cascades
from orchestrator.pipeline.capture.xa import XA_KNOWN
from orchestrator.pipeline.context import open_source, position
from orchestrator.pipeline.failed import REREAD_PENDING, fail_table, table_failure
from orchestrator.pipeline.plan.tables import replan_snapshot
from orchestrator.pipeline.read.step import read_batch
from orchestrator.positions import file_index
from orchestrator.state.store import ChunkRecord, RunRecord, RunTableRecord, StateStore

log = logging.getLogger("orchestrator.pipeline.capture.step")

#: Passes of re-reads one capture call makes before it gives up on a table that keeps changing.
MAX_REREAD_ROUNDS = 3


def stopped(
    named: frozenset[str],
    at: At,
    tables: Mapping[str, CaptureTable],
    starts: Mapping[str, At],
    cascades: Cascades | None,
    whole: frozenset[str] = frozenset(),
) -> list[str]:
    """The tables the capture stops keeping at a change at ``at`` of the ``named`` ones
    (docs/design.md, "Foreign-key cascades"), in order:

    - each named one whose own start is before ``at`` (its base already has an earlier change;
      a cascade parent's rows are decoded from the pass's earliest start, `starts`, for the
      cascades of its children, but only its own start says what its base holds);
    - the run tables below a named parent that a cascade at ``at`` can reach and that started
      before ``at``: the change's cascades are in no row event;
    - every run table still captured below a parent it stops keeping, and the ``whole`` ones,
      whatever their start: their derivation needs the parent's rows after ``at``, which are no
      longer decoded.

    ``starts`` holds `NEVER` for a table no longer kept; a table not in it is not captured.
    """

    def own(table: str) -> At | None:
        start = starts.get(table)
        return tables[table].start.key if start not in (None, NEVER) and table in tables else start

    lost = {t for t in named if (s := own(t)) is not None and at[:2] > s[:2]}
    out = set(lost)
    every = set(whole)
    if cascades is not None:
        for table in named:
            if table in cascades.as_parent and starts.get(table, NEVER) != NEVER:
                out |= cascades.below(table, at)
                if table in lost:
                    every |= cascades.below(table, at, every=True)
    out |= {t for t in every if starts.get(t, NEVER) != NEVER}
    return sorted(out)


def pending_rereads(store: StateStore, run_id: str) -> dict[str, dict[str, Any]]:
    """``{table: {"what", "position"}}`` of the run's tables waiting for a re-read."""
    return {
        r.table: r.info[REREAD_PENDING]
        for r in store.run_tables_where(run_id, status="planned", info_key=REREAD_PENDING)
    }


def prepare_rereads(config: PipelineConfig, store: StateStore, run_id: str) -> bool:
    """Re-plan the tables waiting for a re-read, read every chunk left, move ``H``.

    Returns whether anything was done (the capture then has a new ``H`` to go to).

    Raises:
        RunFailed: chunks of a table that is not being re-read are unread (capture
            runs after the read step).
    """
    records = store.run_tables_where(run_id, status="planned", info_key=REREAD_PENDING)
    pending = {r.table: r.info[REREAD_PENDING] for r in records}
    known = {r.table: r.info.get(XA_KNOWN) or [] for r in records}  # still true of the table
    with open_source(config) as source:
        for table, reason in sorted(pending.items()):
            try:
                replan_snapshot(config, store, run_id, table, source, reason, known[table])
            except Exception as exc:  # e.g. the DDL dropped it: that table's failure alone
                if (why := table_failure(exc)) is None:
                    raise
                fail_table(store, run_id, table, "plan", f"{why} (re-read after {reason['what']})")
        unread = _unread(store, run_id)
        for batch in sorted({c.batch for c in unread}):  # Spark is started if a batch needs it
            read_batch(config, run_id, batch)
        run = store.get_run(run_id)
        highs = [position(c.high) for c in store.chunks(run_id, status="done") if c.high]
        if run.high_position is not None and all(h <= position(run.high_position) for h in highs):
            return bool(pending)
        high = source.current_position()
        store.set_run_positions(run_id, high=high.to_json())
        if pending or unread:
            log.info(
                "run %s: re-read %s; capture goes on to H = %s",
                run_id,
                ", ".join(sorted(pending) or sorted({c.table for c in unread})),
                high,
            )
        return True


def _unread(store: StateStore, run_id: str) -> list[ChunkRecord]:
    """The pending chunks of the run's re-read tables (not failed); a RunFailed when another
    table's chunks are unread (capture runs after the read step)."""
    unread = store.chunks(run_id, status="pending")
    if not unread:  # a run of thousands of incremental tables has none: no record is decoded
        return []
    records = {r.table: r for r in store.run_tables(run_id)}
    unread = [c for c in unread if records[c.table].status != "failed"]
    stray = sorted({c.table for c in unread if "reread" not in records[c.table].info})
    if stray:
        raise RunFailed(
            f"run {run_id}: chunks of {', '.join(stray)} are not read yet; "
            "capture runs after every read batch is done"
        )
    return unread


def give_up_rereads(store: StateStore, run_id: str, pending: dict[str, dict[str, Any]]) -> None:
    """Tables that changed again during each re-read of the run fail on their own; the
    others (captured up to ``H`` by the last pass) are published."""
    for table, reason in sorted(pending.items()):
        fail_table(
            store,
            run_id,
            table,
            "capture",
            f"it changed again during each of {MAX_REREAD_ROUNDS} re-reads of this run (last: "
            f"{reason['what']} at {position(reason['position'])}); wait until the changes it is "
            "re-read for (DDL, TRUNCATE, statement-format writes) have settled",
        )


def check_binlog_kept(
    store: StateStore, run: RunRecord, records: list[RunTableRecord], oldest: str | None
) -> None:
    """Raise BinlogPurged if binlog the capture needs is gone, after resetting what must be read
    again.

    The run's snapshot tables need the binlog from the run's start (or the capture's
    checkpoint); an incremental table needs it from its published position. The tables
    that lost it are dropped from the run's plan, so the rerun replans them with a new
    start: snapshot tables are read again, incremental ones are re-snapshotted.
    """
    if oldest is None:
        return
    checkpoint = store.capture_checkpoint(run.run_id)
    resume = position(checkpoint["position"]) if checkpoint else None
    lost = [
        r
        for r in records
        if file_index((resume or position(r.info["from_position"])).file) < file_index(oldest)
    ]
    if not lost:
        return
    chunks = {r.table: len(store.chunks(run.run_id, table=r.table)) for r in lost}
    needed = resume or min(position(r.info["from_position"]) for r in lost)
    store.restart_run(run.run_id, [r.table for r in lost])
    described = ", ".join(
        f"{t} ({n} chunks)" if n else f"{t} (published; will be re-snapshotted)"
        for t, n in chunks.items()
    )
    raise BinlogPurged(
        f"binlog {needed.file} (needed from {needed}) was purged; the server keeps binlogs from "
        f"{oldest}. These tables must be read again: {described}. Their plan was reset: rerun "
        "`tidemark run` to read them again, and keep binlogs longer (`tidemark doctor` checks "
        "retention)"
    )
