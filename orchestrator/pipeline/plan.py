"""The plan step: start or resume a run, record ``P0``, plan each table's chunks.

`plan` is the step (the CLI and the DAG call it through `orchestrator.steps`):
it takes the pipeline lock, records the run's start position ``P0`` before any
key bound is read (then waits ``read_margin_seconds`` before the first; the reads come after it:
a transaction already in the binlog before ``P0`` may not be visible to readers yet, and an
insert above the planned max key would be neither read nor captured; a run of incremental
tables only reads no key bound and does not wait), and plans every table to snapshot; a
table already published is incremental. One table's chunk plan (`plan_table`) and ``tidemark plan`` live in
`orchestrator.pipeline.table_plan`. Planning reads only key bounds and index walks,
never row data, and never prints connection settings.

Positions belong to the server that recorded them (`orchestrator.source.failover`): a
published position of another server (a failover, a new replica, ``RESET MASTER``) is
carried to the source by its GTID set, or the table is read again; an unfinished run
whose positions are another server's is left behind and a new run starts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from chunking import chunk_predicate, encode_key
from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import ConfigError, LockLost
from orchestrator.lake import storage
from orchestrator.lake.manifest import Manifest, find_manifest
from orchestrator.pipeline.batches import BatchRef, Draft, assign_batches, pending_batches
from orchestrator.pipeline.context import open_source, open_store, run_dir, table_dir, take_lock
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.filtering import compile_table_filter
from orchestrator.pipeline.segments import void_mark
from orchestrator.pipeline.table_plan import check_escaping, plan_table
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.runtime.failures import describe
from orchestrator.schema.tables import TableInfo, table_info_to_json
from orchestrator.schema.types import arrow_type
from orchestrator.source.connection import Source
from orchestrator.source.failover import Follower, moved_run
from orchestrator.source.listing import table_set, tables_info
from orchestrator.state.store import (
    ChunkRecord,
    PlannedTable,
    RunRecord,
    StateStore,
    TableCheckpoint,
)
from orchestrator.table_patterns import TableSet, dropped, explicit_set, listed

log = logging.getLogger("tidemark.planning")

#: Tables planned before they are recorded, in one transaction with their chunks.
FLUSH_TABLES = 500


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
            _plan_tables(config, store, run, failing or {})
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
    published = {cp.table: cp.version for cp in store.table_checkpoints(config.pipeline)}
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


def _plan_tables(
    config: PipelineConfig, store: StateStore, run: RunRecord, failing: dict[str, str]
) -> None:
    """Plan every table of the run not planned yet (all of them on a fresh run), recording them
    `FLUSH_TABLES` at a time, each time in one transaction with their chunks in batches. A run
    of no table (a pattern that matches none yet) plans nothing."""
    options = run.options
    effective = config.with_chunk_size(options.get("chunk_size"))
    planned = {table for table, _, _ in store.run_table_states(run.run_id)}
    names = [name for name in options.get("tables", []) if name not in planned]
    if not names:
        return
    todo = list(effective.select_tables(names))
    with open_source(config) as source:
        # A table planned into a run whose capture has begun (it was reset meanwhile) starts at
        # its own position: the capture goes on from its checkpoint, after the run's P0.
        late = store.capture_checkpoint(run.run_id) is not None or run.high_position is not None
        if run.start_position is None:
            start = source.current_position()
            store.set_run_positions(run.run_id, start=start.to_json())
            log.info("run %s: start position P0 = %s", run.run_id, start)
            run = store.get_run(run.run_id)
        margin = _Margin(
            config.defaults.read_margin_seconds
        )  # before any key bound: see the docstring
        oldest = source.oldest_binlog()
        check_escaping(source.query)
        follower = Follower(config, source)
        checkpoints = {cp.table: cp for cp in store.table_checkpoints(config.pipeline)}
        for first in range(0, len(todo), FLUSH_TABLES):
            part = todo[first : first + FLUSH_TABLES]
            infos = (
                {} if late else tables_info(source, [t.name for t in part if t.name not in failing])
            )
            drafts: list[PlannedTable | Draft] = []
            for table in part:
                if table.name in failing:
                    fail_table(store, run.run_id, table.name, "plan", failing[table.name])
                    continue
                try:
                    drafts.append(
                        _plan_one(
                            config,
                            store,
                            run,
                            table,
                            source,
                            oldest,
                            follower,
                            infos.get(table.name),
                            checkpoints.get(table.name),
                            late=late,
                            margin=margin,
                        )
                    )
                except Exception as exc:  # one table's trouble is its own (`pipeline.failed`)
                    reason = table_failure(exc)
                    if reason is None:
                        raise
                    fail_table(store, run.run_id, table.name, "plan", reason)
            _record(config, store, run.run_id, drafts)


def _record(
    config: PipelineConfig, store: StateStore, run_id: str, drafts: list[PlannedTable | Draft]
) -> None:
    """Record planned tables in one transaction, the snapshots' chunks in batches."""
    snapshots = [d for d in drafts if isinstance(d, Draft)]
    next_batch = max(store.batches(run_id), default=-1) + 1
    batched = iter(assign_batches(snapshots, next_batch, config.defaults))
    plans = [next(batched) if isinstance(d, Draft) else d for d in drafts]
    store.add_run_tables(run_id, plans)
    for p in plans:
        if p.mode == "snapshot":
            batches = len({c.batch for c in p.chunks})
            log.info(
                "table %s: snapshot, %d chunks in %d batch(es)", p.table, len(p.chunks), batches
            )


def _plan_one(
    config: PipelineConfig,
    store: StateStore,
    run: RunRecord,
    table: TableConfig,
    source: Source,
    oldest: str | None,
    follower: Follower,
    info: TableInfo | None,
    checkpoint: TableCheckpoint | None,
    *,
    late: bool,
    margin: _Margin,
) -> PlannedTable | Draft:
    """Plan one table of the run: incremental from its published position, or a snapshot."""
    start = source.current_position().to_json() if late else None  # before the table is looked at
    if late:  # its own P0_T wants the same margin before any key bound is read
        time.sleep(config.defaults.read_margin_seconds)
    info = info or source.table_info(table.name)  # not found in bulk: it says why
    if table.where:  # the binlog must evaluate it exactly (refused before any read)
        compile_table_filter(table.where, info, None)
    if checkpoint is not None and not late and not run.options.get("snapshot"):
        manifest = find_manifest(table_dir(config, table.name))
        since = (
            _published_start(follower, table.name, checkpoint, oldest)
            if _not_behind(table.name, manifest, checkpoint.version)
            else None
        )
        if since is not None and _same_shape(table.name, manifest, info):
            assert manifest is not None, "_not_behind: there is one"
            return _incremental(table, manifest, info, since.to_json())
    # Changes the run captured for it before it was reset would override the new read: they are
    # voided in the same transaction that plans it (`pipeline.segments`).
    void = void_mark(store, run.run_id) if late else 0
    if not late:  # P0's margin, before the first key bound of the run is read
        margin.wait()
    return _snapshot_draft(config, run, table, info, source, start=start, void=void)


@dataclass(slots=True)
class _Margin:
    """``read_margin_seconds`` after ``P0``, waited once, before the first key bound of the run is
    read (see the module docstring): what planning does meanwhile (the tables' shapes, the
    published checkpoints) counts towards it, since the margin runs from ``P0`` (made after it).
    A run whose tables are all incremental reads no key bound and does not wait: their changes
    come from the binlog, whatever readers could see at ``P0``."""

    seconds: float
    waited: bool = False
    started: float = field(default_factory=time.monotonic)

    def wait(self) -> None:
        if not self.waited:
            time.sleep(max(0.0, self.started + self.seconds - time.monotonic()))
            self.waited = True


def _not_behind(table: str, manifest: Manifest | None, version: int) -> bool:
    """Whether ``current.json`` names at least the version the table's checkpoint records. It
    always does, unless a process that lost the pipeline lock replaced it in the instant after
    its last fence check (docs/design.md "One writer"): the changes since the checkpoint's
    position would then be applied to an older version, and only a re-read is exact."""
    if manifest is not None and manifest["version"] >= version:
        return True
    log.warning(
        "table %s: current.json names version %s, older than version %d the state store "
        "published: re-read",
        table,
        manifest["version"] if manifest else "none",
        version,
    )
    return False


def _published_start(
    follower: Follower, table: str, checkpoint: TableCheckpoint, oldest: str | None
) -> BinlogPosition | None:
    """Where on the source the table's published version goes on from; None when it must be
    read again (the position is another server's and its GTID set cannot be found here, or
    the binlog since was purged)."""
    placed = follower.place(BinlogPosition.from_json(checkpoint.position))
    if placed.position is None:
        log.warning("table %s: re-read (version %d): %s", table, checkpoint.version, placed)
        return None
    if oldest is not None and file_index(placed.position.file) < file_index(oldest):
        log.warning(
            "table %s: the binlog since its version %d (%s) was purged (oldest kept: "
            "%s); it is snapshotted again",
            table,
            checkpoint.version,
            placed.position.file,
            oldest,
        )
        return None
    return placed.position


def _same_shape(table: str, manifest: Manifest | None, info: TableInfo) -> bool:
    """Whether the table has the columns of its published version, with the types they were
    published as; if not, it is re-read (its changes since then cannot be applied to rows of
    another shape, nor to files of another type: a TINYINT(1) that joined a key)."""
    assert manifest is not None, "a published table has a manifest"
    published = [(c["name"], c["mysql_type"], c.get("arrow_type")) for c in manifest["columns"]]
    current = [(c.name, c.column_type, str(arrow_type(c))) for c in info.columns]
    if published != current:
        log.warning(
            "table %s: columns changed since version %d (%s -> %s): re-read",
            table,
            manifest["version"],
            published,
            current,
        )
    return published == current


def _incremental(
    table: TableConfig, manifest: Manifest, info: TableInfo, since: dict[str, Any]
) -> PlannedTable:
    log.info(
        "table %s: incremental from %s (published version %s)",
        table.name,
        BinlogPosition.from_json(since),
        manifest["version"],
    )
    return PlannedTable(
        table.name,
        "incremental",
        None,
        list(manifest["chunk_key"]),
        {
            "table_info": table_info_to_json(info),
            "from_position": since,
            "base_version": manifest["version"],
        },
        [],
    )


def replan_snapshot(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    table: str,
    source: Source,
    reason: dict[str, Any],
) -> None:
    """Plan a table of the run again as a snapshot starting now (a re-read inside the run).

    Its new start position ``P0_T`` is recorded before any key bound is read, as ``P0`` is. Its
    change segments captured so far are voided in the transaction that replaces its plan.
    """
    run = store.get_run(run_id)
    start = source.current_position()
    time.sleep(config.defaults.read_margin_seconds)  # P0_T's margin, as P0's
    table_config = config.with_chunk_size(run.options.get("chunk_size")).table(table)
    draft = _snapshot_draft(
        config,
        run,
        table_config,
        source.table_info(table),
        source,
        start=start.to_json(),
        reread={**reason, "from": start.to_json()},
        void=void_mark(store, run_id),
    )
    next_batch = max(store.batches(run_id), default=-1) + 1
    p = assign_batches([draft], next_batch, config.defaults)[0]
    store.add_run_table(
        run_id,
        p.table,
        "snapshot",
        strategy=p.strategy,
        chunk_key=p.chunk_key,
        info=p.info,
        chunks=p.chunks,
        replan=True,
    )
    log.info("table %s: re-read from %s", table, start)


def _snapshot_draft(
    config: PipelineConfig,
    run: RunRecord,
    table: TableConfig,
    info: TableInfo,
    source: Source,
    *,
    start: dict[str, Any] | None = None,
    reread: dict[str, Any] | None = None,
    void: int = 0,
) -> Draft:
    table_plan = plan_table(
        source.query,
        table,
        info,
        config.defaults,
        check_mode=False,
        time_zone=config.source.time_zone,
    )
    chunks = [
        ChunkRecord(
            run_id=run.run_id,
            table=table.name,
            index=chunk.index,
            batch=-1,
            start=encode_key(chunk.range.start),
            end=encode_key(chunk.range.end),
            where=chunk_predicate(table_plan.chunk_key, chunk.range, info.columns, table.where),
            status="pending",
            low=None,
            high=None,
            rows=None,
            bytes=None,
            path=None,
            attempts=0,
        )
        for chunk in table_plan.chunks
    ]
    plan = PlannedTable(
        table.name,
        "snapshot",
        table_plan.strategy,
        list(table_plan.chunk_key),
        {
            "table_info": table_info_to_json(info),
            "from_position": start or run.start_position,
            "stats": table_plan.stats,
            **({"reread": reread} if reread else {}),
            **({"segments_after": void} if void else {}),
        },
        chunks,
    )
    return Draft(plan, int(table_plan.stats.get("rows") or 0), table.batch_chunks)
