"""The reconcile step: every captured table of a run reconciled, the results recorded
(docs/design.md, step 5).

`reconcile` is the step (the CLI and the DAG call it through `orchestrator.app.steps`). It lists the
run's durable change segments and read chunks once, then per table: a published table without a
change keeps its version (`orchestrator.pipeline.reconcile.kept`), any other is reconciled by
`orchestrator.pipeline.reconcile.rewrite`'s rule (the snapshot's chunk files, or the published
version's files, plus the run's changes). One table's own trouble fails that table alone. At
least `WORKERS_FROM` incremental tables with small changes are reconciled first, in worker
processes (`_in_workers`, `orchestrator.pipeline.workers`)."""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

from orchestrator.config import PipelineConfig
from orchestrator.errors import StateError
from orchestrator.lake import storage
from orchestrator.lake.layout import FileRange
from orchestrator.lake.manifest import Manifests
from orchestrator.pipeline import workers
from orchestrator.pipeline.changes import key_names
from orchestrator.pipeline.context import (
    current_run,
    open_catalog,
    open_store,
    position,
    run_dir,
    spark_session,
    table_dir,
    table_info,
)
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.keyless import is_keyless
from orchestrator.pipeline.lines import TableLines
from orchestrator.pipeline.reconcile import multiset
from orchestrator.pipeline.reconcile.kept import SNAPSHOTS, KeptPlans, unchanged_plan
from orchestrator.pipeline.reconcile.rewrite import (
    Target,
    reconcile_incremental,
    reconcile_snapshot,
)
from orchestrator.pipeline.segments import Durable, durable, forget
from orchestrator.services import faults, lean
from orchestrator.state.many import RECORD_TABLES
from orchestrator.state.store import RunTableRecord, StateStore

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from orchestrator.schema.tables import TableInfo

#: The reconcile module's logger, as before the step moved here (its lines keep their name).
log = logging.getLogger("orchestrator.pipeline.reconcile.rewrite")

#: Incremental tables with changes that `reconcile` hands to worker processes, at least: a small
#: table's reconcile takes about 12 ms of one core, starting and stopping the workers about 65 ms.
#: One worker per core (`workers.worker_count`): 500 changed tables reconciled in 4.3 s with two
#: workers on two cores, 4.7 s with four (medians of 6 alternating rounds).
WORKERS_FROM = 16
#: A table whose change segments are larger is reconciled by the run itself: a worker holds a
#: table's changes in memory as the run does, and several workers hold several tables' at once
#: (the run's own rewrite spreads a large table's files over the cores instead).
WORKER_CHANGES_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """Rows per table at ``H``, for the tables this call reconciled."""

    rows: dict[str, int]

    def __str__(self) -> str:
        if not self.rows:
            return "nothing to reconcile"
        return "reconciled " + ", ".join(f"{t} ({n} rows)" for t, n in sorted(self.rows.items()))


def _data_file_schema(config: PipelineConfig, info: TableInfo, catalog: Catalog) -> pa.Schema:
    """`orchestrator.lake.iceberg.data_file_schema`, imported when a file is written."""
    from orchestrator.lake import iceberg

    return iceberg.data_file_schema(config, info, catalog)


def _file_schema(
    config: PipelineConfig, info: TableInfo, catalog: Callable[[], Catalog]
) -> Callable[[], pa.Schema]:
    """The schema of a table's new data files, from the Iceberg table, asked for when the first
    is written (an incremental run whose columns did not change takes the published version's
    field IDs instead: `rewrite.published_ids_first`)."""
    return functools.cache(lambda: _data_file_schema(config, info, catalog()))


def _reconcile_one(
    config: PipelineConfig,
    guard: Callable[[], None],
    record: RunTableRecord,
    reconciled: str,
    spark: SparkSession | Literal[False] | None,
    changes: list[str],
    chunk_dirs: list[str],
    catalog: Callable[[], Catalog],
    plans: KeptPlans | None = None,
    recorded: Mapping[str, Sequence[FileRange]] | None = None,
    changes_bytes: int | None = None,
) -> tuple[int, SparkSession | None]:
    """Reconcile one captured table into ``reconciled``; returns its rows and the session
    (started if it needed one). ``guard``: the run's fence check; ``changes``: its durable
    segments; ``chunk_dirs``: its read chunks' directories (a snapshot); ``catalog``: the Iceberg
    catalog, opened once; ``plans``: the batch that takes a snapshot's plan when no file is
    written (``reconciled`` names it); ``recorded``: chunk directories whose files the read
    recorded (`ChunkRecord.ranges`); ``changes_bytes``: the segments' bytes, from the run's
    listing (None: asked of the store); ``spark`` False: no session may start here (a worker
    process: `_NeedsSpark` is raised instead)."""
    info = table_info(record)
    guard()  # a process that lost the pipeline lock writes nothing more
    started: list[SparkSession] = []

    def session() -> SparkSession:
        if spark is False:
            raise _NeedsSpark(record.table)
        if spark is not None:
            return spark
        if not started:
            started.append(spark_session(config))
        return started[0]

    if is_keyless(record):  # rows counted, not keyed: `orchestrator.pipeline.reconcile.multiset`
        rows = _reconcile_keyless(
            config, record, reconciled, changes, chunk_dirs, catalog, plans, recorded
        )
        faults.point("reconcile.rewritten")
        return rows, spark or None
    key = key_names(info, record.chunk_key)
    cluster = config.spark.remote is None and not config.spark.master.startswith("local")
    target = Target(
        info,
        key,
        _file_schema(config, info, catalog),
        reconciled,
        cluster=cluster,
        changes_bytes=changes_bytes,
    )
    if record.mode == "snapshot":
        rows = reconcile_snapshot(session, target, chunk_dirs, changes, plans, recorded=recorded)
    else:
        rows = reconcile_incremental(
            session,
            info,
            key,
            table_dir(config, record.table),
            changes,
            reconciled,
            schema=target.schema_of,
            cluster=cluster,
            planned=record.info.get("base_version"),
            changes_bytes=changes_bytes,
        )
    faults.point("reconcile.rewritten")
    return rows, spark or (started[0] if started else None)


class _NeedsSpark(Exception):
    """A table a reconcile worker cannot reconcile: it needs a Spark session (the run's)."""


def _reconcile_keyless(
    config: PipelineConfig,
    record: RunTableRecord,
    reconciled: str,
    changes: list[str],
    chunk_dirs: list[str],
    catalog: Callable[[], Catalog],
    plans: KeptPlans | None,
    recorded: Mapping[str, Sequence[FileRange]] | None,
) -> int:
    """`_reconcile_one` of a table without a key: its rows count (`multiset`)."""
    info = table_info(record)
    target = Target(info, (), _file_schema(config, info, catalog), reconciled)
    if record.mode == "incremental":
        return multiset.reconcile_incremental(
            target, table_dir(config, record.table), changes, record.info.get("base_version")
        )
    recorded = recorded or {}
    unrecorded = [d for d in chunk_dirs if d not in recorded]
    if unrecorded:
        raise StateError(f"internal: table {record.table}: its read recorded no files")
    ranges = [r for d in chunk_dirs for r in recorded[d]]
    start = position(record.info["from_position"])
    return multiset.reconcile_snapshot(target, ranges, changes, start, plans)


def reconcile(
    config: PipelineConfig, run_id: str, *, spark: SparkSession | None = None
) -> ReconcileResult:
    """Per table: base files (snapshot chunks, or the published version) + changes -> the table at
    H.

    The run's durable segments and chunks are listed once, and the reconciled tables are
    recorded `RECORD_TABLES` at a time in one transaction: a run of thousands of small tables
    pays no state round trip per table (one not recorded yet is reconciled again by the rerun).
    Small tables with changes are reconciled first, in worker processes (`_in_workers`, before
    any Spark session starts), then the others in this process (`_in_process`), a table a
    worker handed back among them; both results are recorded the same way.
    """
    store = open_store(config)
    try:
        current_run(store, config, run_id)
        todo = [r for r in store.run_tables(run_id) if r.status == "captured"]
        inputs = _inputs(config, store, run_id, todo)
        out: dict[str, int] = {}
        done: list[tuple[str, int, dict[str, Any]]] = []
        unchanged = TableLines(log)  # the lines of tables without a change: one for all of them
        settled: set[str] = set()  # tables reconciled or failed, by a worker or by this process
        results = itertools.chain(
            _in_workers(config, run_id, todo, inputs, store.check_fence),
            # read once the workers are done: the tables they did not settle
            _in_process(
                config,
                run_id,
                store.check_fence,
                spark,
                inputs,
                lambda: [r for r in todo if r.table not in settled],
            ),
        )
        batches = (inputs.kept, inputs.snapshots)
        try:
            for result in results:
                if result.needs_spark:  # `_in_process` reconciles it
                    continue
                settled.add(result.table)
                if result.reason is not None:
                    fail_table(store, run_id, result.table, "reconcile", result.reason)
                    continue
                done.append((result.table, result.rows, {"reconciled_dir": result.out_dir}))
                out[result.table] = result.rows
                _reconciled_line(unchanged, result)
                if len(done) >= RECORD_TABLES:
                    done = _record(store, run_id, done, *batches)
        except Exception as exc:
            if not isinstance(exc, StateError):  # the tables reconciled so far are recorded
                _record(store, run_id, done, *batches)
            raise
        _record(store, run_id, done, *batches)
        unchanged.flush()
        return ReconcileResult(out)
    finally:
        forget()  # the capture's segments kept in memory, read or not
        store.close()


class _Inputs(NamedTuple):
    """What the run's reconcile reads, listed once (`_inputs`): the tables' durable segments, the
    snapshots' chunk directories and the files their read recorded, the Iceberg catalog (opened
    when a file is written), and the batches that take the plans of tables without a change."""

    segments: Mapping[str, list[str]]
    sizes: Mapping[str, int]  # the segments' bytes per table
    chunk_dirs: Mapping[str, list[str]]
    recorded: Mapping[str, Sequence[FileRange]]
    catalog: Callable[[], Catalog]
    kept: KeptPlans  # incremental tables without a change
    snapshots: KeptPlans  # snapshots without a change


def _inputs(
    config: PipelineConfig, store: StateStore, run_id: str, todo: Sequence[RunTableRecord]
) -> _Inputs:
    """`_Inputs` of the run's tables ``todo``; starts pyiceberg's import when one has changes."""
    found = durable(store, config.staging_path, run_id) if todo else Durable({}, {})
    segments = found.files
    chunk_dirs: dict[str, list[str]] = {}
    recorded: dict[str, list[FileRange]] = {}  # chunk dir -> its files, as the read recorded them
    if any(r.mode == "snapshot" for r in todo):
        for chunk in store.chunks(run_id):
            if chunk.path:
                chunk_dirs.setdefault(chunk.table, []).append(chunk.path)
                if chunk.ranges is not None:
                    recorded[chunk.path] = cast(list[FileRange], chunk.ranges)
    if any(segments.get(r.table) for r in todo):
        # A table with changes writes files: pyiceberg is imported meanwhile, by a thread of its
        # own (the first file written waits for it), not by the first of the rewrite's threads
        # while the others wait.
        lean.preload("orchestrator.lake.iceberg")
    return _Inputs(
        segments,
        found.sizes,
        chunk_dirs,
        recorded,
        functools.cache(lambda: open_catalog(config)),
        KeptPlans(config, run_id),
        KeptPlans(config, run_id, SNAPSHOTS),
    )


class _Reconciled(NamedTuple):
    """A table's reconcile: its rows at ``H`` in ``out_dir`` (``kept``: without a change, the
    published version it keeps), or its own failure (``reason``). From a worker (`_in_workers`)
    also what fails the run (``error``), or that it needs the run's Spark session
    (``needs_spark``: `_in_process` reconciles it)."""

    table: str
    out_dir: str
    rows: int = 0
    reason: str | None = None
    error: Exception | None = None
    needs_spark: bool = False
    kept: int | None = None


def _reconciled_line(unchanged: TableLines, result: _Reconciled) -> None:
    """A reconciled table's log line; those of tables without a change go to ``unchanged``."""
    if result.kept is None:
        log.info("table %s: reconciled, %d rows at H", result.table, result.rows)
        return
    unchanged.add(
        result.table,
        f"reconciled, {result.rows} rows at H (no change: version {result.kept} kept)",
        "reconciled, no change (versions kept)",
    )


def _out_dir(config: PipelineConfig, run_id: str, table: str) -> str:
    """A new directory for ``table``'s reconcile, unique to this attempt: another process's
    reconcile (one that lost the lock) never writes where publish reads, and publish reads what
    the state names."""
    return run_dir(config, run_id, "reconciled", f"{table}-{storage.attempt_tag()}")


def _in_process(
    config: PipelineConfig,
    run_id: str,
    guard: Callable[[], None],
    spark: SparkSession | None,
    inputs: _Inputs,
    todo: Callable[[], Sequence[RunTableRecord]],
) -> Iterator[_Reconciled]:
    """Reconcile the tables ``todo()`` names in this process, one at a time (a Spark session
    started for one serves the next): each one's `_Reconciled`. A table's own trouble fails that
    table alone; an error that fails the run is raised. The current manifests of the tables
    without a change are read together (`Manifests`)."""
    records = todo()
    unchanged = [
        table_dir(config, r.table)
        for r in records
        if r.mode == "incremental" and not inputs.segments.get(r.table)
    ]
    with Manifests(unchanged) as manifests:
        for record in records:
            segments = inputs.segments.get(record.table, [])
            out_dir = _out_dir(config, run_id, record.table)
            try:
                plan = (
                    unchanged_plan(config, record, manifests.find)
                    if record.mode == "incremental" and not segments
                    else None
                )
                if plan is not None:
                    out_dir = inputs.kept.add(record.table, plan)
                    result = _Reconciled(record.table, out_dir, plan.rows, kept=plan.base_version)
                else:
                    batched = (
                        inputs.snapshots if record.mode == "snapshot" and not segments else None
                    )
                    if batched is not None:
                        out_dir = batched.dir_of(record.table)
                    rows, spark = _reconcile_one(
                        config,
                        guard,
                        record,
                        out_dir,
                        spark,
                        segments,
                        inputs.chunk_dirs.get(record.table, []),
                        inputs.catalog,
                        batched,
                        inputs.recorded,
                        inputs.sizes.get(record.table),
                    )
                    result = _Reconciled(record.table, out_dir, rows)
            except Exception as exc:  # one table's own trouble fails that table alone
                if (reason := table_failure(exc)) is None:
                    raise
                result = _Reconciled(record.table, out_dir, reason=reason)
            yield result


def _in_workers(
    config: PipelineConfig,
    run_id: str,
    todo: Sequence[RunTableRecord],
    inputs: _Inputs,
    guard: Callable[[], None],
) -> Iterator[_Reconciled]:
    """Reconcile the incremental tables of ``todo`` with small changes (at most
    `WORKER_CHANGES_BYTES`) in worker processes (`orchestrator.pipeline.workers`), when there are
    at least `WORKERS_FROM` of them: each one's `_Reconciled` as its group ends. A table's own
    failure comes back as its ``reason``; an error that fails the run is raised once the groups
    in hand are handed over (`workers.each_group`)."""
    segments, sizes = inputs.segments, inputs.sizes
    changed = [r for r in todo if r.mode == "incremental" and segments.get(r.table)]
    if len(changed) < WORKERS_FROM:
        return
    small = [r for r in changed if sizes[r.table] <= WORKER_CHANGES_BYTES]
    count = (
        workers.worker_count(len(small), workers.per_core(config, 1))
        if len(small) >= WORKERS_FROM
        else 1
    )
    if count == 1 or not workers.may_fork_workers():
        return
    log.info("reconciling %d tables in %d worker processes", len(small), count)
    given = [
        (
            record,
            _out_dir(config, run_id, record.table),
            segments[record.table],
            sizes[record.table],
        )
        for record in small
    ]
    yield from workers.each_group(
        config,
        workers.groups(given, count),
        _in_worker,
        guard,
        count=count,
        failed=lambda result: result.error,
        died="a reconcile worker process died (killed from outside: out of memory?); "
        "`tidemark run` reconciles its tables again",
    )


def _in_worker(group: Sequence[tuple[RunTableRecord, str, list[str], int]]) -> list[_Reconciled]:
    """A group's tables reconciled in a worker (`_in_workers`); an error that fails the run ends
    the group there (its tables not reached stay captured: a rerun reconciles them)."""
    config = workers.run_config()
    out = []
    for record, out_dir, changes, size in group:
        try:
            rows, _ = _reconcile_one(
                config,
                workers.fence,
                record,
                out_dir,
                False,
                changes,
                [],
                workers.lake_catalog,
                changes_bytes=size,
            )
        except _NeedsSpark:
            out.append(_Reconciled(record.table, out_dir, needs_spark=True))
            continue
        except Exception as exc:
            if (reason := table_failure(exc)) is None:
                out.append(_Reconciled(record.table, out_dir, error=workers.portable(exc)))
                break
            out.append(_Reconciled(record.table, out_dir, reason=reason))
            continue
        out.append(_Reconciled(record.table, out_dir, rows))
    return out


def _record(
    store: StateStore, run_id: str, done: list[tuple[str, int, dict[str, Any]]], *batches: KeptPlans
) -> list[tuple[str, int, dict[str, Any]]]:
    """Record reconciled tables in one transaction, after the batched plans of those without a
    change are written; returns an empty list."""
    for batch in batches:
        batch.write(store)
    store.reconciled_tables(run_id, done)
    for _ in done:
        faults.point("reconcile.table_done")
    return []
