"""The run's steps, one function each: the CLI and the Airflow DAG call exactly these.

Each step is idempotent and records its result in the state store before it
returns, so a retried or re-run step skips what is done. Steps take the
pipeline config and the run id and open what they need (source connection,
state store, SparkSession) themselves, so each can run in its own process.

Correctness rests on one rule (DESIGN.md, "Why it is correct"): the run's
binlog capture starts at ``P0``, recorded before any chunk bound was read and
so before every chunk's low position ``L``; it ends at ``H``, recorded after
every read ended. The last change of a key in ``(P0, H]`` is its state at
``H``; a key without one keeps its snapshot row. Replaying from a position
earlier than a chunk's ``L`` is always safe with full row images, so one start
position serves every chunk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import BinlogPurged, ConfigError, RunFailed
from orchestrator.lake import storage
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.runtime import faults
from orchestrator.schema.tables import TableInfo, table_info_from_json, table_info_to_json
from orchestrator.state.store import ChunkRecord, RunRecord, RunTableRecord, StateStore

log = logging.getLogger(__name__)

#: Called with (step, done, total, rows) as a step makes progress; the CLI draws bars from it.
ProgressFn = Callable[[str, int, int, int], None]


@dataclass(frozen=True, slots=True)
class BatchRef:
    """One unit of parallel reading: some chunks of one table, one Spark job."""

    batch: int
    table: str
    chunks: int
    label: str  # e.g. "shop.orders [1] .. [400001)" — for map_index_template


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


# ------------------------------------------------------------------ helpers


def open_store(config: PipelineConfig) -> StateStore:
    return StateStore(config.state.url)


def _source(config: PipelineConfig) -> Any:
    """The source, for steps that run after preflight reached it: a source that cannot be
    reached now is restarting, and is retried like a lost connection."""
    from orchestrator.source.connection import Source

    return Source.from_pipeline(config, known_good=True)


def take_lock(store: StateStore, config: PipelineConfig, holder: str) -> None:
    """Take (or re-take, refreshing it) the pipeline lock for ``holder``.

    A CLI run's lock is bound to its process (taken over once the pid is gone);
    an Airflow run's tasks are many processes, so only the lease expires it.
    Re-taking lets a single cleared Airflow task continue after the failed run
    released the lock.
    """
    store.acquire_lock(config.pipeline, holder, config_path=str(config.path or ""),
                       track_pid=holder.startswith("cli:"))


def run_dir(config: PipelineConfig, run_id: str) -> str:
    return storage.join(config.staging_path, run_id)


def table_dir(config: PipelineConfig, table: str) -> str:
    database, name = table.split(".", 1)
    return storage.join(config.output.path, database, name)


def _table_info(record: RunTableRecord) -> TableInfo:
    return table_info_from_json(record.info["table_info"])


def _position(data: dict[str, Any] | None) -> BinlogPosition:
    if data is None:
        raise RunFailed("internal: a position the run needs was never recorded; rerun resumes")
    return BinlogPosition.from_json(data)


def _batch_label(table: str, chunks: list[ChunkRecord]) -> str:
    first, last = chunks[0], chunks[-1]
    start = "-inf" if first.start is None else str(first.start)
    end = "max" if last.end is None else str(last.end)
    return f"{table} chunks {first.index}-{last.index} [{start} .. {end})"


def _pending_batches(store: StateStore, run_id: str) -> list[BatchRef]:
    by_batch: dict[int, list[ChunkRecord]] = {}
    for chunk in store.chunks(run_id, status="pending"):
        by_batch.setdefault(chunk.batch, []).append(chunk)
    return [BatchRef(batch=b, table=cs[0].table, chunks=len(cs), label=_batch_label(cs[0].table, cs))
            for b, cs in sorted(by_batch.items())]


# ------------------------------------------------------------------ preflight


def preflight(config: PipelineConfig, tables: list[str] | None = None) -> None:
    """Raise SourceNotReady with every failed check (see orchestrator.source.doctor)."""
    from orchestrator.source.doctor import preflight as check

    check(config, [t.name for t in config.select_tables(tables)])


# ------------------------------------------------------------------ plan


def plan(config: PipelineConfig, *, tables: list[str] | None = None, snapshot: bool = False,
         chunk_size: int | None = None, holder: str) -> RunHandle:
    """Resume the pipeline's unfinished run, or start a new one.

    Takes the pipeline lock for ``holder``, records ``P0``, then plans the
    chunks of every table to snapshot. Tables already published and not asked
    to be re-snapshotted are incremental: their binlog is applied from their
    checkpoint. A rerun of the same run reuses what was planned.
    """
    store = open_store(config)
    try:
        take_lock(store, config, holder)
        run = store.unfinished_run(config.pipeline)
        resumed = run is not None
        if run is None:
            selected = [t.name for t in config.select_tables(tables)]
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
        _plan_tables(config, store, run)
        records = store.run_tables(run.run_id)
        return RunHandle(
            run_id=run.run_id,
            resumed=resumed,
            tables=[r.table for r in records],
            snapshot_tables=[r.table for r in records if r.mode == "snapshot"],
            batches=_pending_batches(store, run.run_id),
        )
    finally:
        store.close()


def _plan_tables(config: PipelineConfig, store: StateStore, run: RunRecord) -> None:
    """Plan every table of the run not planned yet (all of them on a fresh run)."""
    options = run.options
    effective = config.with_chunk_size(options.get("chunk_size"))
    planned = {r.table for r in store.run_tables(run.run_id)}
    todo = [t for t in effective.select_tables(options["tables"]) if t.name not in planned]
    if not todo:
        return
    with _source(config) as source:
        if run.start_position is None:
            start = source.current_position()
            store.set_run_positions(run.run_id, start=start.to_json())
            log.info("run %s: start position P0 = %s", run.run_id, start)
            run = store.get_run(run.run_id)
        next_batch = max(store.batches(run.run_id), default=-1) + 1
        oldest = source.oldest_binlog()
        for table in todo:
            info = source.table_info(table.name)
            checkpoint = store.table_checkpoint(config.pipeline, table.name)
            if checkpoint is not None and oldest is not None and \
                    file_index(checkpoint.position["file"]) < file_index(oldest):
                log.warning("table %s: the binlog since its version %d (%s) was purged (oldest kept: "
                            "%s); it is snapshotted again", table.name, checkpoint.version,
                            checkpoint.position["file"], oldest)
                checkpoint = None
            if checkpoint is not None and not options.get("snapshot"):
                _plan_incremental(config, store, run, table, info, checkpoint.position)
            else:
                next_batch = _plan_snapshot(config, store, run, table, info, source, next_batch)


def _plan_incremental(config: PipelineConfig, store: StateStore, run: RunRecord, table: TableConfig,
                      info: TableInfo, since: dict[str, Any]) -> None:
    from orchestrator.pipeline.publish import read_manifest

    manifest = read_manifest(table_dir(config, table.name))
    published = [(c["name"], c["mysql_type"]) for c in manifest["columns"]]
    current = [(c.name, c.column_type) for c in info.columns]
    if published != current:
        raise ConfigError(
            f"table {table.name} changed shape since version {manifest['version']} was published "
            f"(columns {published} -> {current}); re-snapshot it: "
            f"tidemark run --config {config.path} --table {table.name} --snapshot"
        )
    store.add_run_table(run.run_id, table.name, "incremental", strategy=None,
                        chunk_key=list(manifest["chunk_key"]),
                        info={"table_info": table_info_to_json(info), "from_position": since,
                              "base_version": manifest["version"]})
    log.info("table %s: incremental from %s (published version %s)", table.name,
             BinlogPosition.from_json(since), manifest["version"])


def _plan_snapshot(config: PipelineConfig, store: StateStore, run: RunRecord, table: TableConfig,
                   info: TableInfo, source: Any, next_batch: int) -> int:
    from chunking import chunk_predicate, encode_key
    from orchestrator.pipeline.plan import plan_table

    table_plan = plan_table(source.query, table, info, config.defaults)
    key = list(table_plan.chunk_key)
    chunks = []
    for i, chunk in enumerate(table_plan.chunks):
        chunks.append(ChunkRecord(
            run_id=run.run_id, table=table.name, index=chunk.index,
            batch=next_batch + i // table.batch_chunks,
            start=encode_key(chunk.range.start), end=encode_key(chunk.range.end),
            where=chunk_predicate(table_plan.chunk_key, chunk.range, info.columns, table.where),
            status="pending", low=None, high=None, rows=None, bytes=None, path=None, attempts=0,
        ))
    store.add_run_table(run.run_id, table.name, "snapshot", strategy=table_plan.strategy, chunk_key=key,
                        info={"table_info": table_info_to_json(info),
                              "from_position": run.start_position, "stats": table_plan.stats},
                        chunks=chunks)
    batches = (len(chunks) + table.batch_chunks - 1) // table.batch_chunks
    log.info("table %s: snapshot, %d chunks in %d batches", table.name, len(chunks), batches)
    return next_batch + batches


# ------------------------------------------------------------------ read


def read_batch(config: PipelineConfig, run_id: str, batch: int, *, spark: Any = None,
               holder: str | None = None) -> dict[str, Any]:
    """Read one batch of chunks between its low and high position (skips done chunks).

    Records ``L`` before the reads start and waits ``read_margin_seconds`` (a
    transaction can reach the binlog a moment before its rows are visible),
    then runs one Spark job for the batch's chunks and records ``Hb`` after it.
    """
    from orchestrator.pipeline.read import read_batch as spark_read

    store = open_store(config)
    try:
        pending = store.chunks(run_id, batch=batch, status="pending")
        if not pending:
            return {"rows": 0, "bytes": 0, "chunks": 0, "skipped": True}
        table = pending[0].table
        record = next(r for r in store.run_tables(run_id) if r.table == table)
        info = _table_info(record)
        base = storage.join(run_dir(config, run_id), "snapshot", table)
        paths = {c.index: storage.join(base, f"chunk-{c.index:06d}") for c in pending}
        spark = spark or _spark(config)
        attempts = config.defaults.read_attempts
        with _source(config) as source:
            for attempt in range(1, attempts + 1):
                # A retried batch records a fresh L: its reads start again after it.
                low = source.current_position()
                store.mark_batch_started(run_id, batch, low.to_json())
                time.sleep(config.defaults.read_margin_seconds)
                try:
                    results = spark_read(spark, config, info, [(c.index, c.where) for c in pending],
                                         lambda index: paths[index])
                    break
                except Exception as exc:
                    # Lost or refused connections are worth another try; a bad predicate is not.
                    if attempt == attempts or not getattr(exc, "transient", False):
                        raise
                    wait = min(2.0 ** attempt, 30.0)
                    log.warning("batch %d (%s): read failed (%s); retry %d/%d in %.0fs", batch, table,
                                _first_line(exc), attempt, attempts - 1, wait)
                    time.sleep(wait)
            high = source.current_position()
        rows = nbytes = 0
        for chunk in pending:
            n, b = results[chunk.index]
            store.mark_chunk_done(run_id, table, chunk.index, high=high.to_json(), rows=n, bytes=b,
                                  path=paths[chunk.index])
            rows, nbytes = rows + n, nbytes + b
        faults.point("read.batch_done")
        if holder:
            take_lock(store, config, holder)
        log.info("batch %d (%s, %d chunks): %d rows, %d bytes, L=%s Hb=%s", batch, table,
                 len(pending), rows, nbytes, low, high)
        return {"rows": rows, "bytes": nbytes, "chunks": len(pending), "skipped": False}
    finally:
        store.close()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


def _spark(config: PipelineConfig) -> Any:
    from orchestrator.runtime.spark import get_session

    return get_session(config)


# ------------------------------------------------------------------ capture


def capture(config: PipelineConfig, run_id: str, *, progress: Callable[[int], None] | None = None
            ) -> dict[str, Any]:
    """Record ``H`` (once, after every read ended) and capture the binlog up to it."""
    from orchestrator.pipeline.capture import CaptureTable, capture_changes

    store = open_store(config)
    try:
        unread = store.chunks(run_id, status="pending")
        if unread:
            names = sorted({c.table for c in unread})
            raise RunFailed(f"run {run_id}: {len(unread)} chunk(s) of {', '.join(names)} are not "
                            "read yet; capture runs after every read batch is done")
        run = store.get_run(run_id)
        records = [r for r in store.run_tables(run_id) if r.status == "planned"]
        if not records:
            return {"rows": 0, "skipped": True}
        with _source(config) as source:
            _check_binlog_kept(store, run, records, source.oldest_binlog())
            if run.high_position is None:
                store.set_run_positions(run_id, high=source.current_position().to_json())
                run = store.get_run(run_id)
        stop = _position(run.high_position)
        tables = {r.table: CaptureTable(info=_table_info(r), key=tuple(r.chunk_key),
                                        start=_position(r.info["from_position"])) for r in records}
        result = capture_changes(config, store, run_id, tables, stop,
                                 batch_rows=config.defaults.capture_batch_rows, progress=progress)
        for r in records:
            store.set_table_status(run_id, r.table, "captured")
        log.info("capture up to H=%s: %s", stop, result)
        return {"rows": sum(result.rows.values()), "skipped": False}
    finally:
        store.close()


def _check_binlog_kept(store: StateStore, run: RunRecord, records: list[RunTableRecord],
                       oldest: str | None) -> None:
    """Raise BinlogPurged if binlog the capture needs is gone, after resetting what must be read again.

    The run's snapshot tables need the binlog from the run's start (or the capture's
    checkpoint); an incremental table needs it from its published position. The tables
    that lost it are dropped from the run's plan, so the rerun replans them with a new
    start: snapshot tables are read again, incremental ones are re-snapshotted.
    """
    if oldest is None:
        return
    checkpoint = store.capture_checkpoint(run.run_id)
    resume = _position(checkpoint["position"]) if checkpoint else None
    lost = [r for r in records
            if file_index((resume or _position(r.info["from_position"])).file) < file_index(oldest)]
    if not lost:
        return
    chunks = {r.table: len(store.chunks(run.run_id, table=r.table)) for r in lost}
    needed = resume or min(_position(r.info["from_position"]) for r in lost)
    store.restart_run(run.run_id, [r.table for r in lost])
    described = ", ".join(f"{t} ({n} chunks)" if n else f"{t} (published; will be re-snapshotted)"
                          for t, n in chunks.items())
    raise BinlogPurged(
        f"binlog {needed.file} (needed from {needed}) was purged; the server keeps binlogs from "
        f"{oldest}. These tables must be read again: {described}. Their plan was reset: rerun "
        "`tidemark run` to read them again, and keep binlogs longer (`tidemark doctor` checks retention)"
    )


# ------------------------------------------------------------------ reconcile


def reconcile(config: PipelineConfig, run_id: str, *, spark: Any = None) -> dict[str, Any]:
    """Per table: base rows (snapshot chunks, or the published version) + changes -> the table at H."""
    from orchestrator.pipeline.reconcile import reconcile_incremental, reconcile_table

    store = open_store(config)
    try:
        out: dict[str, int] = {}
        for record in store.run_tables(run_id):
            if record.status != "captured":
                continue
            info = _table_info(record)
            changes = storage.join(run_dir(config, run_id), "changes", record.table)
            reconciled = storage.join(run_dir(config, run_id), "reconciled", record.table)
            if record.mode == "snapshot":
                spark = spark or _spark(config)
                base = [c.path for c in store.chunks(run_id, table=record.table) if c.path]
                rows = reconcile_table(spark, info, tuple(record.chunk_key), base, changes, reconciled)
            else:  # rewrites only the published files that hold changed keys; Spark only if it must
                rows = reconcile_incremental(spark or (lambda: _spark(config)), info, tuple(record.chunk_key),
                                             table_dir(config, record.table), changes, reconciled)
            store.set_table_status(run_id, record.table, "reconciled", rows=rows)
            faults.point("reconcile.table_done")
            out[record.table] = rows
            log.info("table %s: reconciled, %d rows at H", record.table, rows)
        return {"rows": out}
    finally:
        store.close()


# ------------------------------------------------------------------ publish


def publish(config: PipelineConfig, run_id: str, *, holder: str) -> list[Published]:
    """Write versions, switch manifests, checkpoint tables, finish the run, release the lock."""
    from orchestrator.pipeline.publish import publish_table
    from orchestrator.state.store import TableCheckpoint

    store = open_store(config)
    try:
        run = store.get_run(run_id)
        high = _position(run.high_position)
        published: list[Published] = []
        for record in store.run_tables(run_id):
            tdir = table_dir(config, record.table)
            if record.status == "reconciled":
                manifest = publish_table(config, _table_info(record), tuple(record.chunk_key),
                                         storage.join(run_dir(config, run_id), "reconciled", record.table),
                                         high, run_id)
                faults.point("publish.files_written")
                store.save_table_checkpoint(TableCheckpoint(
                    pipeline=config.pipeline, table=record.table, version=manifest["version"],
                    position=high.to_json(), rows=manifest["rows"],
                    manifest=storage.join(tdir, "_tidemark", "current.json"), run_id=run_id,
                    published_at=_now()))
                store.set_table_status(run_id, record.table, "published", rows=manifest["rows"],
                                       version=manifest["version"])
                faults.point("publish.table_done")
                log.info("table %s: published version %d, %d rows at %s", record.table,
                         manifest["version"], manifest["rows"], high)
            elif record.status != "published":
                raise RunFailed(f"table {record.table} is {record.status}, not reconciled; "
                                "rerun to resume")
            cp = store.table_checkpoint(config.pipeline, record.table)
            assert cp is not None
            published.append(Published(table=record.table, uri=tdir, version=cp.version,
                                       rows=cp.rows, position=cp.position))
        store.finish_run(run_id, "succeeded")
        storage.delete_tree(run_dir(config, run_id))
        store.release_lock(config.pipeline, holder)
        return published
    finally:
        store.close()


def fail_run(config: PipelineConfig, run_id: str, error: str, *, holder: str | None = None) -> None:
    """Mark a run failed (state kept: the next run resumes it) and release the lock."""
    store = open_store(config)
    try:
        store.finish_run(run_id, "failed", error=error)
        if holder:
            store.release_lock(config.pipeline, holder)
    finally:
        store.close()


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
