"""The plan step: start or resume a run, record ``P0``, plan each table's chunks.

`plan` is the step (the CLI and the DAG call it through `orchestrator.app.steps`):
it takes the pipeline lock, records the run's start position ``P0`` before any
key bound is read (then waits ``read_margin_seconds`` before the first; the reads come after it:
a transaction already in the binlog before ``P0`` may not be visible to readers yet, and an
insert above the planned max key would be neither read nor captured; a run of incremental
tables only reads no key bound and does not wait), and plans every table to snapshot; a
table already published is incremental. Each table's plan is `orchestrator.pipeline.plan.tables`;
its chunks, `orchestrator.pipeline.plan.chunks`. Planning reads only key bounds and index walks,
never row data, and never prints connection settings.

Positions belong to the server that recorded them (`orchestrator.binlog.failover`): a
published position of another server (a failover, a new replica, ``RESET MASTER``) is
carried to the source by its GTID set, or the table is read again; an unfinished run
whose positions are another server's is left behind and a new run starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from orchestrator.binlog.failover import Follower, moved_run
from orchestrator.config import PipelineConfig
from orchestrator.config.patterns import TableSet, dropped, explicit_set, listed
from orchestrator.errors import ConfigError, LockLost
from orchestrator.lake import storage
from orchestrator.pipeline.context import open_source, open_store, run_dir, take_lock
from orchestrator.pipeline.plan.batches import BatchRef, pending_batches
from orchestrator.pipeline.plan.tables import plan_tables
from orchestrator.services.failures import describe
from orchestrator.source.listing import Shapes, table_set
from orchestrator.state.store import (
    RunRecord,
    StateStore,
)

log = logging.getLogger("tidemark.planning")


@dataclass(frozen=True, slots=True)
class RunHandle:
    """The run `plan` started or resumed, and what is left to read."""

    run_id: str
    resumed: bool  # True when an unfinished run was picked up instead of a new one
    tables: list[str]  # every table of the run
    snapshot_tables: list[str]  # those being snapshotted (the rest are incremental)
    batches: list[BatchRef]  # batches with chunks still to read
    dropped: list[str] = field(default_factory=list)  # published tables a pattern no longer finds
    options: dict[str, Any] = field(default_factory=dict)  # what the run was started with

    def asked(self, tables: list[str], snapshot: bool, chunk_size: int | None) -> bool:
        """Whether this is the run a request (its tables resolved) asked for: a new run, or an
        unfinished one started with the same options."""
        request = {"tables": tables, "snapshot": snapshot, "chunk_size": chunk_size}
        return not self.resumed or all(self.options.get(k) == v for k, v in request.items())

    def __str__(self) -> str:
        how = "resumed" if self.resumed else "started"
        incremental = len(self.tables) - len(self.snapshot_tables)
        dropped = (
            f"; {len(self.dropped)} dropped at the source, kept as published"
            if self.dropped
            else ""
        )
        return (
            f"run {self.run_id} {how}: {len(self.snapshot_tables)} table(s) to snapshot, "
            f"{incremental} incremental, {len(self.batches)} batch(es) to read{dropped}"
        )


# --------------------------------------------------------------------------- the step


def plan(
    config: PipelineConfig,
    *,
    tables: list[str] | None = None,
    snapshot: bool = False,
    chunk_size: int | None = None,
    holder: str,
    fresh: bool = False,
    failing: dict[str, str] | None = None,
    shapes: Shapes | None = None,
) -> RunHandle:
    """Resume the pipeline's unfinished run, or start a new one.

    With ``fresh`` (``run --snapshot``, a DAG run's ``snapshot: true``) the tables asked for
    leave an unfinished run of other options, or of the same options that *failed*, which is
    left behind when none of its tables is left (`takes_out`), so "re-snapshot it" advice
    works while a failed run exists; not a run ``holder`` started itself (a cleared or retried
    DAG run resumes its own run).

    Takes the pipeline lock for ``holder``, fixes a new run's tables (its patterns expanded
    over the source's tables, `orchestrator.source.listing.table_set`), records ``P0``, then
    plans the chunks of every table to snapshot. Tables already published and not asked
    to be re-snapshotted are incremental: their binlog is applied from their
    checkpoint. A rerun of the same run reuses what was planned. ``failing`` (preflight's
    tables that failed a check of their own, with its line) are recorded failed, not planned.
    ``shapes``: the tables' shapes preflight read after a position; a new run takes that
    position as ``P0`` and plans with them (`plan_tables`).
    """
    store = open_store(config)
    try:
        take_lock(store, config, holder)
        run = store.unfinished_run(config.pipeline)
        found: FoundTables | None = None
        if run is None or fresh:
            found = find_tables(config, store, tables)
        if run is not None and fresh and run.options.get("started_by") != holder:
            assert found is not None
            run = _take_out(store, run, found.selected)
        if run is not None:
            run = _leave_if_moved(config, store, run)
        if run is not None:
            run = _drop_unconfigured(config, store, run)
        resumed = run is not None
        if run is None:
            found = found or find_tables(config, store, tables)
            run = _new_run(config, store, found, snapshot, chunk_size, holder)
        else:
            log.info(
                "run %s: resuming the unfinished run started %s (status %s)",
                run.run_id,
                run.created_at.isoformat(timespec="seconds"),
                run.status,
            )
            if run.status != "running":
                store.finish_run(run.run_id, "running")
        try:
            plan_tables(config, store, run, failing or {}, shapes)
        except Exception as exc:  # no ghost: the run is failed with its reason, the lock released
            if isinstance(exc, LockLost):  # not ours any more: nothing more is written
                raise
            store.finish_run(run.run_id, "failed", error=f"planning failed: {describe(exc)}")
            store.release_lock(config.pipeline, holder)
            raise
        states = store.run_table_states(run.run_id)
        return RunHandle(
            run_id=run.run_id,
            resumed=resumed,
            tables=[table for table, _, _ in states],
            snapshot_tables=[
                t for t, mode, status in states if mode == "snapshot" and status != "failed"
            ],
            batches=pending_batches(store, run.run_id),
            dropped=found.dropped if found is not None else [],
            options=dict(store.get_run(run.run_id).options),
        )
    finally:
        store.close()


@dataclass(frozen=True, slots=True)
class FoundTables:
    """The pipeline's tables now, those a request names, and the published ones no pattern finds."""

    tables: TableSet
    selected: list[str]
    dropped: list[str]


def find_tables(config: PipelineConfig, store: StateStore, names: list[str] | None) -> FoundTables:
    """The table set (the source is asked only when the config has patterns), the tables of it
    ``names`` select (all when none), and the published tables a pattern took that are gone."""
    if not config.has_patterns:
        found = explicit_set(config.tables)
        return FoundTables(found, [t.name for t in found.select(names)], [])
    with open_source(config) as source:
        found = table_set(config, source)
    for match in found.patterns:
        log.info("pattern %s", match)
    published = store.published_versions(config.pipeline)
    gone = dropped(config.tables, found, published)
    for table in gone:
        log.warning(
            "table %s: a pattern took it, but it is no longer at the source: kept in the lake as "
            "published (version %d)",
            table,
            published[table],
        )
    return FoundTables(found, [t.name for t in found.select(names)], gone)


def requested_tables(config: PipelineConfig, names: list[str] | None) -> list[str]:
    """The tables a request names (all when none; a pattern entry: what it matches); the source
    is asked only when the config has patterns."""
    if not config.has_patterns:
        return [t.name for t in config.select_tables(names)]
    with open_source(config) as source:
        return [t.name for t in table_set(config, source).select(names)]


def _new_run(
    config: PipelineConfig,
    store: StateStore,
    found: FoundTables,
    snapshot: bool,
    chunk_size: int | None,
    holder: str,
) -> RunRecord:
    if chunk_size is not None and chunk_size < 1:
        raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size}")
    run = store.create_run(
        config.pipeline,
        {
            "tables": found.selected,
            "snapshot": snapshot,
            "chunk_size": chunk_size,
            "started_by": holder,
        },
    )
    if config.has_patterns:
        store.save_table_set(
            config.pipeline, run.run_id, [m.to_json() for m in found.tables.patterns], found.dropped
        )
    log.info(
        "run %s: new, %d table(s) %s%s",
        run.run_id,
        len(found.selected),
        listed(found.selected),
        " (re-snapshot)" if snapshot else "",
    )
    return run


def takes_out(run: RunRecord, tables: list[str]) -> bool:
    """Whether ``run --snapshot`` of ``tables`` takes some of them out of the unfinished ``run``
    (not when it is the same request interrupted: that resumes its own run; the same request
    that *failed* starts afresh, as "re-snapshot it" advice means)."""
    options = run.options
    same = (
        bool(options.get("snapshot"))
        and sorted(options.get("tables", [])) == sorted(tables)
        and run.status != "failed"
    )
    return not same and bool(set(tables) & set(options.get("tables", [])))


def _take_out(store: StateStore, run: RunRecord, tables: list[str]) -> RunRecord | None:
    """``run --snapshot`` of ``tables`` while ``run`` is unfinished: they leave that run (it
    resumes for its other tables) and start afresh in a run of their own, with their own
    start position and plan. The same request again resumes its own run."""
    if not takes_out(run, tables):
        return run
    if set(run.options.get("tables", [])) <= set(
        tables
    ):  # nothing of it is left: left behind whole
        log.info("run %s (%s) is left behind: a new run starts afresh", run.run_id, run.status)
        if run.status == "running":  # interrupted: not shown as running for ever
            store.finish_run(
                run.run_id, "failed", error="interrupted; left behind by a snapshot of its tables"
            )
        return None
    leaving = [t for t in tables if t in run.options.get("tables", [])]
    store.drop_from_run(run.run_id, leaving)
    log.info("run %s: %s leave(s) it to be snapshotted afresh", run.run_id, ", ".join(leaving))
    return store.get_run(run.run_id)


def _leave_if_moved(config: PipelineConfig, store: StateStore, run: RunRecord) -> RunRecord | None:
    """An unfinished run whose positions are another server's is left behind (its reads are
    lost: what it snapshotted is read again) and a new run starts; None then."""
    with open_source(config) as source:
        reason = moved_run(Follower(config, source), store, run)
    if reason is None:
        return run
    log.warning(
        "run %s is left behind: %s; a new run starts, going on from the published "
        "positions by GTID and reading again what this run had not published",
        run.run_id,
        reason,
    )
    store.finish_run(run.run_id, "failed", error=f"left behind: the source changed ({reason})")
    storage.delete_tree(run_dir(config, run.run_id))
    return None


def _drop_unconfigured(config: PipelineConfig, store: StateStore, run: RunRecord) -> RunRecord:
    """An unfinished run's tables the config no longer takes (removed from the YAML meanwhile)
    leave it, unless published: the run resumes for the others (it failed on every resume)."""
    published = {t for t, _, status in store.run_table_states(run.run_id) if status == "published"}
    gone = [
        t for t in run.options.get("tables", []) if t not in published and config.entry(t) is None
    ]
    if not gone:
        return run
    log.warning(
        "run %s: table(s) %s are no longer in the config: they leave the run (what is published "
        "of them is kept; `tidemark reset --table` forgets them)",
        run.run_id,
        listed(gone),
    )
    store.drop_from_run(run.run_id, gone)
    return store.get_run(run.run_id)
