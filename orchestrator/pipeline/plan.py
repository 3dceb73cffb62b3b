"""The plan step: start or resume a run, record ``P0``, plan each table's chunks.

`plan` is the step (the CLI and the DAG call it through `orchestrator.steps`):
it takes the pipeline lock, records the run's start position ``P0`` before any
key bound is read (then waits ``read_margin_seconds``, as after each ``L``: a
transaction already in the binlog before ``P0`` may not be visible to readers yet, and
an insert above the planned max key would be neither read nor captured), and plans
every table to snapshot; a table already published
is incremental. One table's chunk plan (`plan_table`) and ``tidemark plan`` live in
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
from dataclasses import dataclass
from typing import Any

from chunking import chunk_predicate, encode_key
from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import ConfigError, LockLost
from orchestrator.lake import storage
from orchestrator.lake.manifest import find_manifest, read_manifest
from orchestrator.pipeline.context import open_source, open_store, run_dir, table_dir, take_lock
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.filtering import compile_table_filter
from orchestrator.pipeline.segments import void_mark
from orchestrator.pipeline.table_plan import plan_table
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.runtime.failures import describe
from orchestrator.schema.tables import TableInfo, table_info_to_json
from orchestrator.source.connection import Source
from orchestrator.source.failover import Follower, moved_run
from orchestrator.state.store import ChunkRecord, RunRecord, StateStore, TableCheckpoint

log = logging.getLogger("tidemark.planning")


@dataclass(frozen=True, slots=True)
class BatchRef:
    """One unit of parallel reading: some chunks of one table, one Spark job."""

    batch: int
    table: str
    chunks: int
    label: str  # e.g. "shop.orders chunks 0-15 [1 .. 400001)": the Airflow map index label

    def __str__(self) -> str:
        return f"batch {self.batch}: {self.label}"


@dataclass(frozen=True, slots=True)
class RunHandle:
    """The run `plan` started or resumed, and what is left to read."""

    run_id: str
    resumed: bool  # True when an unfinished run was picked up instead of a new one
    tables: list[str]  # every table of the run
    snapshot_tables: list[str]  # those being snapshotted (the rest are incremental)
    batches: list[BatchRef]  # batches with chunks still to read

    def __str__(self) -> str:
        how = "resumed" if self.resumed else "started"
        incremental = len(self.tables) - len(self.snapshot_tables)
        return (f"run {self.run_id} {how}: {len(self.snapshot_tables)} table(s) to snapshot, "
                f"{incremental} incremental, {len(self.batches)} batch(es) to read")


# --------------------------------------------------------------------------- the step


def plan(config: PipelineConfig, *, tables: list[str] | None = None, snapshot: bool = False,
         chunk_size: int | None = None, holder: str, fresh: bool = False,
         failing: dict[str, str] | None = None) -> RunHandle:
    """Resume the pipeline's unfinished run, or start a new one.

    With ``fresh`` (``run --snapshot``) a run that *failed* (ended with an error, its
    state kept) is left behind and a new run starts, so "re-snapshot it" advice works
    while the failed run exists; an interrupted run (killed, still ``running``) is
    resumed as always.

    Takes the pipeline lock for ``holder``, records ``P0``, then plans the
    chunks of every table to snapshot. Tables already published and not asked
    to be re-snapshotted are incremental: their binlog is applied from their
    checkpoint. A rerun of the same run reuses what was planned. ``failing`` (preflight's
    tables that failed a check of their own, with its line) are recorded failed, not planned.
    """
    store = open_store(config)
    try:
        take_lock(store, config, holder)
        run = store.unfinished_run(config.pipeline)
        selected = [t.name for t in config.select_tables(tables)]
        if run is not None and fresh:
            run = _take_out(store, run, selected)
        if run is not None:
            run = _leave_if_moved(config, store, run)
        resumed = run is not None
        if run is None:
            if chunk_size is not None and chunk_size < 1:
                raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size}")
            run = store.create_run(config.pipeline, {"tables": selected, "snapshot": snapshot,
                                                     "chunk_size": chunk_size})
            log.info("run %s: new, tables %s%s", run.run_id, ", ".join(selected),
                     " (re-snapshot)" if snapshot else "")
        else:
            log.info("run %s: resuming the unfinished run started %s (status %s)",
                     run.run_id, run.created_at.isoformat(timespec="seconds"), run.status)
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
        records = store.run_tables(run.run_id)
        return RunHandle(
            run_id=run.run_id,
            resumed=resumed,
            tables=[r.table for r in records],
            snapshot_tables=[r.table for r in records if r.mode == "snapshot" and r.status != "failed"],
            batches=pending_batches(store, run.run_id),
        )
    finally:
        store.close()


def takes_out(run: RunRecord, tables: list[str]) -> bool:
    """Whether ``run --snapshot`` of ``tables`` takes some of them out of the unfinished ``run``
    (not when it is the same request interrupted: that resumes its own run; the same request
    that *failed* starts afresh, as "re-snapshot it" advice means)."""
    options = run.options
    same = bool(options.get("snapshot")) and sorted(options.get("tables", [])) == sorted(tables) \
        and run.status != "failed"
    return not same and bool(set(tables) & set(options.get("tables", [])))


def _take_out(store: StateStore, run: RunRecord, tables: list[str]) -> RunRecord | None:
    """``run --snapshot`` of ``tables`` while ``run`` is unfinished: they leave that run (it
    resumes for its other tables) and start afresh in a run of their own, with their own
    start position and plan. The same request again resumes its own run."""
    if not takes_out(run, tables):
        return run
    if set(run.options.get("tables", [])) <= set(tables):  # nothing of it is left: left behind whole
        log.info("run %s (%s) is left behind: a new run starts afresh", run.run_id, run.status)
        if run.status == "running":  # interrupted: not shown as running for ever
            store.finish_run(run.run_id, "failed", error="interrupted; left behind by run --snapshot")
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
    log.warning("run %s is left behind: %s; a new run starts, going on from the published "
                "positions by GTID and reading again what this run had not published", run.run_id, reason)
    store.finish_run(run.run_id, "failed", error=f"left behind: the source changed ({reason})")
    storage.delete_tree(run_dir(config, run.run_id))
    return None


def pending_batches(store: StateStore, run_id: str) -> list[BatchRef]:
    """The run's batches that still have chunks to read, in batch order."""
    by_batch: dict[int, list[ChunkRecord]] = {}
    last_index: dict[str, int] = {}
    failed = {r.table for r in store.run_tables(run_id) if r.status == "failed"}
    for chunk in store.chunks(run_id):
        last_index[chunk.table] = max(chunk.index, last_index.get(chunk.table, -1))
        if chunk.status == "pending" and chunk.table not in failed:
            by_batch.setdefault(chunk.batch, []).append(chunk)
    return [BatchRef(batch=b, table=cs[0].table, chunks=len(cs),
                     label=_batch_label(cs[0].table, cs, ends_table=cs[-1].index == last_index[cs[0].table]))
            for b, cs in sorted(by_batch.items())]


def _batch_label(table: str, chunks: list[ChunkRecord], *, ends_table: bool) -> str:
    """A batch's key range as ``[start .. end)``; ``]`` when it holds the table's last chunk,
    which includes its end key (the table's max key).

    >>> from dataclasses import replace
    >>> c = ChunkRecord("r", "db.t", 0, 0, None, [5], "", "pending", None, None, None, None, None, 0)
    >>> _batch_label("db.t", [c, replace(c, index=1, start=[5], end=[9])], ends_table=True)
    'db.t chunks 0-1 [-inf .. [9]]'
    >>> _batch_label("db.t", [c], ends_table=False)
    'db.t chunks 0-0 [-inf .. [5])'
    """
    first, last = chunks[0], chunks[-1]
    start = "-inf" if first.start is None else str(first.start)
    end = "max)" if last.end is None else f"{last.end}{']' if ends_table else ')'}"
    return f"{table} chunks {first.index}-{last.index} [{start} .. {end}"


def _plan_tables(config: PipelineConfig, store: StateStore, run: RunRecord, failing: dict[str, str]) -> None:
    """Plan every table of the run not planned yet (all of them on a fresh run)."""
    options = run.options
    effective = config.with_chunk_size(options.get("chunk_size"))
    planned = {r.table for r in store.run_tables(run.run_id)}
    todo = [t for t in effective.select_tables(options["tables"]) if t.name not in planned]
    if not todo:
        return
    with open_source(config) as source:
        # A table planned into a run whose capture has begun (it was reset meanwhile) starts at
        # its own position: the capture goes on from its checkpoint, after the run's P0.
        late = store.capture_checkpoint(run.run_id) is not None or run.high_position is not None
        if run.start_position is None:
            start = source.current_position()
            store.set_run_positions(run.run_id, start=start.to_json())
            log.info("run %s: start position P0 = %s", run.run_id, start)
            run = store.get_run(run.run_id)
        time.sleep(config.defaults.read_margin_seconds)  # before any key bound: see the docstring
        oldest = source.oldest_binlog()
        follower = Follower(config, source)
        for table in todo:
            if table.name in failing:
                fail_table(store, run.run_id, table.name, "plan", failing[table.name])
                continue
            try:
                _plan_one(config, store, run, table, source, oldest, follower, late=late)
            except Exception as exc:  # one table's trouble is its own (`pipeline.failed`)
                reason = table_failure(exc)
                if reason is None:
                    raise
                fail_table(store, run.run_id, table.name, "plan", reason)


def _plan_one(config: PipelineConfig, store: StateStore, run: RunRecord, table: TableConfig, source: Source,
              oldest: str | None, follower: Follower, *, late: bool) -> None:
    """Plan one table of the run: incremental from its published position, or a snapshot."""
    start = source.current_position().to_json() if late else None  # before the table is looked at
    if late:  # its own P0_T wants the same margin before any key bound is read
        time.sleep(config.defaults.read_margin_seconds)
    info = source.table_info(table.name)
    if table.where:  # the binlog must evaluate it exactly (refused before any read)
        compile_table_filter(table.where, info, None)
    checkpoint = store.table_checkpoint(config.pipeline, table.name)
    since = None
    if checkpoint is not None and not late and not run.options.get("snapshot") and \
            _not_behind(config, table.name, checkpoint.version):
        since = _published_start(follower, table.name, checkpoint, oldest)
    if since is not None and _same_shape(config, table.name, info):
        _plan_incremental(config, store, run, table, info, since.to_json())
        return
    # Changes the run captured for it before it was reset would override the new read: they are
    # voided in the same transaction that plans it (`pipeline.segments`).
    void = void_mark(store, run.run_id) if late else 0
    next_batch = max(store.batches(run.run_id), default=-1) + 1
    _plan_snapshot(config, store, run, table, info, source, next_batch, start=start, void=void)


def _not_behind(config: PipelineConfig, table: str, version: int) -> bool:
    """Whether ``current.json`` names at least the version the table's checkpoint records. It
    always does, unless a process that lost the pipeline lock replaced it in the instant after
    its last fence check (docs/design.md "One writer"): the changes since the checkpoint's
    position would then be applied to an older version, and only a re-read is exact."""
    manifest = find_manifest(table_dir(config, table))
    if manifest is not None and manifest["version"] >= version:
        return True
    log.warning("table %s: current.json names version %s, older than version %d the state store "
                "published: re-read", table, manifest["version"] if manifest else "none", version)
    return False


def _published_start(follower: Follower, table: str, checkpoint: TableCheckpoint,
                     oldest: str | None) -> BinlogPosition | None:
    """Where on the source the table's published version goes on from; None when it must be
    read again (the position is another server's and its GTID set cannot be found here, or
    the binlog since was purged)."""
    placed = follower.place(BinlogPosition.from_json(checkpoint.position))
    if placed.position is None:
        log.warning("table %s: re-read (version %d): %s", table, checkpoint.version, placed)
        return None
    if oldest is not None and file_index(placed.position.file) < file_index(oldest):
        log.warning("table %s: the binlog since its version %d (%s) was purged (oldest kept: "
                    "%s); it is snapshotted again", table, checkpoint.version,
                    placed.position.file, oldest)
        return None
    return placed.position


def _same_shape(config: PipelineConfig, table: str, info: TableInfo) -> bool:
    """Whether the table has the columns of its published version; if not, it is re-read
    (its changes since then cannot be applied to rows of another shape)."""
    manifest = read_manifest(table_dir(config, table))
    published = [(c["name"], c["mysql_type"]) for c in manifest["columns"]]
    current = [(c.name, c.column_type) for c in info.columns]
    if published != current:
        log.warning("table %s: columns changed since version %d (%s -> %s): re-read", table,
                    manifest["version"], published, current)
    return published == current


def _plan_incremental(config: PipelineConfig, store: StateStore, run: RunRecord, table: TableConfig,
                      info: TableInfo, since: dict[str, Any]) -> None:
    manifest = read_manifest(table_dir(config, table.name))
    store.add_run_table(run.run_id, table.name, "incremental", strategy=None,
                        chunk_key=list(manifest["chunk_key"]),
                        info={"table_info": table_info_to_json(info), "from_position": since,
                              "base_version": manifest["version"]})
    log.info("table %s: incremental from %s (published version %s)", table.name,
             BinlogPosition.from_json(since), manifest["version"])


def replan_snapshot(config: PipelineConfig, store: StateStore, run_id: str, table: str, source: Source,
                    reason: dict[str, Any]) -> None:
    """Plan a table of the run again as a snapshot starting now (a re-read inside the run).

    Its new start position ``P0_T`` is recorded before any key bound is read, as ``P0`` is. Its
    change segments captured so far are voided in the transaction that replaces its plan.
    """
    run = store.get_run(run_id)
    start = source.current_position()
    time.sleep(config.defaults.read_margin_seconds)  # P0_T's margin, as P0's
    table_config = config.with_chunk_size(run.options.get("chunk_size")).select_tables([table])[0]
    next_batch = max(store.batches(run_id), default=-1) + 1
    _plan_snapshot(config, store, run, table_config, source.table_info(table), source, next_batch,
                   start=start.to_json(), reread={**reason, "from": start.to_json()},
                   void=void_mark(store, run_id))
    log.info("table %s: re-read from %s", table, start)


def _plan_snapshot(config: PipelineConfig, store: StateStore, run: RunRecord, table: TableConfig,
                   info: TableInfo, source: Source, next_batch: int, *,
                   start: dict[str, Any] | None = None, reread: dict[str, Any] | None = None,
                   void: int = 0) -> int:
    table_plan = plan_table(source.query, table, info, config.defaults)
    chunks = [
        ChunkRecord(
            run_id=run.run_id, table=table.name, index=chunk.index,
            batch=next_batch + i // table.batch_chunks,
            start=encode_key(chunk.range.start), end=encode_key(chunk.range.end),
            where=chunk_predicate(table_plan.chunk_key, chunk.range, info.columns, table.where),
            status="pending", low=None, high=None, rows=None, bytes=None, path=None, attempts=0,
        )
        for i, chunk in enumerate(table_plan.chunks)
    ]
    store.add_run_table(run.run_id, table.name, "snapshot", strategy=table_plan.strategy,
                        chunk_key=list(table_plan.chunk_key),
                        info={"table_info": table_info_to_json(info),
                              "from_position": start or run.start_position, "stats": table_plan.stats,
                              **({"reread": reread} if reread else {}),
                              **({"segments_after": void} if void else {})},
                        chunks=chunks, replan=reread is not None)
    batches = (len(chunks) + table.batch_chunks - 1) // table.batch_chunks
    log.info("table %s: snapshot, %d chunks in %d batches", table.name, len(chunks), batches)
    return next_batch + batches
