"""The read step: one batch of chunks between its low and high binlog position.

``L`` is recorded before the reads start and the read margin waited out; the batch's chunks are
read; ``Hb`` is recorded after every read ended. A batch holds chunks of one table, or many small
tables packed together by the plan (`orchestrator.pipeline.plan.batches`). A table planned at most
`orchestrator.pipeline.read.local.LOCAL_ROWS` rows in one chunk is read by the driver
(`orchestrator.pipeline.read.local`: the same SQL, the same files, no Spark task), while Spark reads
the others, each table's chunks in a job of their own (`orchestrator.pipeline.read.jdbc`),
`TABLE_JOBS` jobs at a time from the driver. A batch the driver reads whole starts no Spark session.
The batch's chunks are recorded in one transaction. A batch whose connection was lost is read again
whole, with a fresh ``L``; a table whose read fails on its own (`orchestrator.pipeline.failed`)
fails alone, unless its columns changed since the run planned it: a DDL during the read (a column
dropped or renamed) is what failed it, and the capture re-reads such a table anyway, so it is
marked for that re-read (`orchestrator.pipeline.capture.reread`) and its other batches wait for
it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa

from orchestrator.config import PipelineConfig
from orchestrator.errors import SourceNotReady
from orchestrator.lake import storage
from orchestrator.pipeline.context import (
    current_run,
    open_source,
    open_store,
    run_dir,
    spark_session,
    table_info,
    take_lock,
)
from orchestrator.pipeline.failed import REREAD_PENDING, fail_table, mark_reread, table_failure
from orchestrator.pipeline.keyless import is_keyless
from orchestrator.pipeline.plan.batches import TABLE_JOBS
from orchestrator.pipeline.read.keyless import KeylessTable, read_keyless
from orchestrator.pipeline.read.local import LocalTable, read_tables, reads_locally
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo
from orchestrator.services import faults
from orchestrator.source.retry import read_retry
from orchestrator.state.store import ChunkRead, ChunkRecord, StateStore

if TYPE_CHECKING:  # pyspark is imported by a run that reads (an incremental run does not)
    from pyspark.sql import SparkSession

    from orchestrator.source.connection import Source

log = logging.getLogger(__name__)

#: A table as the read needs it: its columns, and the chunk key its files are sorted by.
TableShape = tuple[TableInfo, tuple[str, ...]]

#: The Spark session a read may use: one running, one starting (`orchestrator.app.early`),
#: or None (started when a table of the batch needs Spark).
SessionLike: TypeAlias = "SparkSession | Future[SparkSession] | None"


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read batch did."""

    batch: int
    table: str  # the batch's table, or "N tables" for a batch of small tables
    chunks: int  # chunks read by this call (0 when the batch was already done)
    rows: int
    bytes: int
    low: BinlogPosition | None = None  # L
    high: BinlogPosition | None = None  # Hb
    failed: int = 0  # tables of the batch that failed on their own
    left: int = 0  # chunks not read: their table failed, or waits for its re-read

    def __str__(self) -> str:
        if self.left and not self.chunks and not self.failed:
            return (
                f"batch {self.batch}: {self.left} chunk(s) of {self.table} left unread (the table "
                "failed, or waits for its re-read)"
            )
        if not self.chunks and not self.failed:
            return f"batch {self.batch}: already read"
        failed = f", {self.failed} table(s) failed" if self.failed else ""
        return (
            f"batch {self.batch} ({self.table}, {self.chunks} chunks): {self.rows} rows, "
            f"{self.bytes} bytes, L={self.low} Hb={self.high}{failed}"
        )


def read_batch(
    config: PipelineConfig,
    run_id: str,
    batch: int,
    *,
    spark: SessionLike = None,
    holder: str | None = None,
) -> ReadResult:
    """Read one batch of chunks between its low and high position (skips done chunks).

    Records ``L`` before the reads start, then reads the batch's tables (small ones in the
    driver, the others in Spark jobs) and records ``Hb`` after all. No margin is waited after
    ``L``: every key is replayed from the run's ``P0`` (or the table's ``P0_T``), which planning
    recorded and then waited ``read_margin_seconds`` after, so a transaction the read cannot see
    yet is in the capture (docs/design.md, "The rule"). A read that lost its connection is tried
    again, with a fresh ``L``.
    """
    store = open_store(config)
    try:
        current_run(store, config, run_id)
        pending = store.chunks(run_id, batch=batch, status="pending")
        if not pending:
            return ReadResult(batch, "", 0, 0, 0)
        tables = {c.table for c in pending}
        records = {r.table: r for r in store.run_tables(run_id) if r.table in tables}
        by_table: dict[str, list[ChunkRecord]] = {}
        for chunk in pending:  # an earlier batch of a failed table failed it: the others go on
            record = records[chunk.table]
            if record.status != "failed" and REREAD_PENDING not in record.info:
                by_table.setdefault(chunk.table, []).append(chunk)
        if not by_table:
            return ReadResult(batch, pending[0].table, 0, 0, 0, left=len(pending))
        infos = {t: (table_info(records[t]), tuple(records[t].chunk_key)) for t in by_table}
        keyless = {t: records[t].info["keyless"] for t in by_table if is_keyless(records[t])}
        local = {
            t
            for t in by_table
            if t not in keyless
            and reads_locally(records[t].info.get("stats", {}).get("rows"), len(by_table[t]))
        }
        return _read_pending(
            config, store, run_id, batch, _Pending(by_table, infos, local, keyless), spark, holder
        )
    finally:
        store.close()


@dataclass(frozen=True, slots=True)
class _Pending:
    """A batch's chunks to read, by table; which tables the driver reads
    (`orchestrator.pipeline.read.local`)."""

    by_table: Mapping[str, list[ChunkRecord]]
    infos: Mapping[str, TableShape]
    local: set[str]
    #: tables without a key (`orchestrator.pipeline.read.keyless`), with their plan's settings
    keyless: Mapping[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def in_driver(self) -> set[str]:
        """The tables the driver reads (no Spark job)."""
        return self.local | self.keyless.keys()

    def __str__(self) -> str:
        return (
            next(iter(self.by_table)) if len(self.by_table) == 1 else f"{len(self.by_table)} tables"
        )


def _read_pending(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    batch: int,
    pending: _Pending,
    spark: SessionLike,
    holder: str | None,
) -> ReadResult:
    """`read_batch` of the batch's pending chunks, grouped by table."""
    what = str(pending)
    session = None if pending.in_driver >= pending.by_table.keys() else _session(config, spark)
    with open_source(config) as source:
        for attempt in read_retry(config.defaults.read_attempts, f"batch {batch} ({what})"):
            with attempt:
                # A retried batch records a fresh L: its reads start again after it.
                low = source.current_position()
                store.mark_batch_started(run_id, batch, low.to_json())
                faults.point("read.batch_started")
                # Chunk dirs unique to this attempt: one the state names is never replaced by
                # another attempt's read (a retry here, or a process that lost the lock).
                reads, failed = _read_tables(
                    session, config, run_id, pending, storage.attempt_tag(), store.check_fence
                )
        high = source.current_position()
        changed = {
            t: why for t in failed if (why := _changed_since_plan(source, t, pending.infos[t][0]))
        }
    for table, reason in sorted(failed.items()):
        if table in changed:
            log.warning(
                "table %s: its read failed (%s) after a DDL (%s since the run planned it); re-read",
                table,
                reason,
                changed[table],
            )
            mark_reread(store, run_id, table, f"a DDL during its read ({changed[table]})", high)
        else:
            fail_table(store, run_id, table, "read", reason)
    store.mark_chunks_done(run_id, reads, high=high.to_json())
    faults.point("read.batch_done")
    if holder:
        take_lock(store, config, holder)
    result = ReadResult(
        batch,
        what,
        len(reads),
        sum(r.rows for r in reads),
        sum(r.bytes for r in reads),
        low,
        high,
        failed=len(failed),
    )
    log.info("%s", result)
    return result


def _changed_since_plan(source: Source, table: str, planned: TableInfo) -> str | None:
    """How ``table``'s columns differ from those the run planned it with, or None when they do
    not (its read failed for another reason: it fails alone).

    >>> from orchestrator.schema.tables import ColumnInfo
    >>> def shape(*columns):
    ...     return TableInfo("d", "t", tuple(ColumnInfo(n, t, t, True) for n, t in columns),
    ...                      ("id",), (), 0)
    >>> class Now:
    ...     def table_info(self, name):
    ...         return shape(("id", "int"), ("f2", "int"), ("v", "bigint"))
    >>> _changed_since_plan(Now(), "d.t", shape(("id", "int"), ("f", "int"), ("v", "int")))
    'columns gone: f; new: f2; retyped: v (int -> bigint)'
    """
    try:
        now = source.table_info(table)
    except SourceNotReady:
        return "the table is gone"
    before = {c.name: c.column_type for c in planned.columns}
    after = {c.name: c.column_type for c in now.columns}
    if list(before.items()) == list(after.items()):
        return None
    parts = [
        ("columns gone", [n for n in before if n not in after]),
        ("new", [n for n in after if n not in before]),
        (
            "retyped",
            [f"{n} ({t} -> {after[n]})" for n, t in before.items() if after.get(n, t) != t],
        ),
    ]
    return "; ".join(f"{what}: {', '.join(names)}" for what, names in parts if names) or (
        "columns reordered"
    )


def _session(config: PipelineConfig, spark: SessionLike) -> SparkSession:
    """The session to read with: the one given, the one starting (waited for), or a new one."""
    if isinstance(spark, Future):  # None: the run's tables looked small (`orchestrator.app.early`)
        spark = spark.result()
    return spark if spark is not None else spark_session(config)


def _read_tables(
    spark: SparkSession | None,
    config: PipelineConfig,
    run_id: str,
    pending: _Pending,
    tag: str,
    guard: Callable[[], None],
) -> tuple[list[ChunkRead], dict[str, str]]:
    """The batch's chunks into chunk dirs and files named with the attempt's ``tag``: the small
    tables in the driver (`orchestrator.pipeline.read.local`) while Spark reads the others, a job
    per table, `TABLE_JOBS` jobs at a time; ``guard`` is the fence check before files are written.
    Returns the chunks read and the tables that failed on their own (with the reason). Any other
    error is raised once every read started has ended (a lost connection: the caller reads the batch
    again)."""
    from orchestrator.lake import iceberg  # pyiceberg: imported by a run that reads or commits

    catalog = iceberg.open_catalog(config)  # once for the batch's tables
    schemas = iceberg.data_file_schemas(
        config, [pending.infos[t][0] for t in pending.by_table], catalog
    )
    paths = _ChunkPaths(config, run_id, tag)
    spark_tables = {t: c for t, c in pending.by_table.items() if t not in pending.in_driver}
    outcomes: dict[str, list[ChunkRead] | Exception] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="tidemark-driver-read") as pool:
        local = pool.submit(_read_locally, config, pending, schemas, paths, guard)
        keyless = pool.submit(_read_keyless, config, pending, schemas, paths, guard)
        if spark_tables:
            assert spark is not None, "a batch with tables for Spark has a session"
            reader = _BatchRead(spark, config, spark_tables, pending.infos, paths, guard, schemas)
            outcomes.update(reader.all())
        outcomes.update(local.result())
        outcomes.update(keyless.result())
    return _sorted_outcomes(outcomes)


def _read_locally(
    config: PipelineConfig,
    pending: _Pending,
    schemas: Mapping[str, pa.Schema],
    paths: _ChunkPaths,
    guard: Callable[[], None],
) -> dict[str, list[ChunkRead] | Exception]:
    """The batch's small tables, read by the driver."""
    tables = [
        LocalTable(
            pending.infos[t][0],
            pending.infos[t][1],
            schemas[t],
            [(c.index, c.where, paths.file_of(t, c)) for c in pending.by_table[t]],
        )
        for t in sorted(pending.local)
    ]
    done = read_tables(config, tables, guard)
    return {
        t: outcome
        if isinstance(outcome, Exception)
        else [
            ChunkRead(
                t,
                c.index,
                written["rows"],
                written["bytes"],
                written["file"],
                ranges=[dict(written)],
            )
            for c, written in zip(pending.by_table[t], outcome, strict=True)
        ]
        for t, outcome in done.items()
    }


def _read_keyless(
    config: PipelineConfig,
    pending: _Pending,
    schemas: Mapping[str, pa.Schema],
    paths: _ChunkPaths,
    guard: Callable[[], None],
) -> dict[str, list[ChunkRead] | Exception]:
    """The batch's tables without a key, one after the other, each whole at one position
    (`orchestrator.pipeline.read.keyless`); the chunk records the position ``S`` too."""
    out: dict[str, list[ChunkRead] | Exception] = {}
    for name in sorted(pending.keyless):
        (chunk,) = pending.by_table[name]
        settings = pending.keyless[name]
        table = KeylessTable(
            info=pending.infos[name][0],
            schema=schemas[name],
            chunk=chunk.index,
            where=chunk.where,
            directory=paths.of(name, chunk),
            estimated_rows=settings.get("rows"),
            rows_per_file=int(settings["rows_per_file"]),
            lock_allowed=bool(settings.get("lock")),
        )
        try:
            read = read_keyless(config, table, guard)
        except Exception as exc:
            out[name] = exc
            continue
        out[name] = [
            ChunkRead(
                name,
                chunk.index,
                read.rows,
                read.bytes,
                table.directory,
                ranges=[dict(f) for f in read.files],
                start=read.start.to_json(),
            )
        ]
    return out


def _sorted_outcomes(
    outcomes: Mapping[str, list[ChunkRead] | Exception],
) -> tuple[list[ChunkRead], dict[str, str]]:
    """The chunks read, and the tables that failed on their own; any other error raised."""
    reads: list[ChunkRead] = []
    failed: dict[str, str] = {}
    errors: list[Exception] = []
    for table, outcome in outcomes.items():
        if isinstance(outcome, Exception):
            reason = table_failure(outcome)
            if reason is None:
                errors.append(outcome)
            else:
                failed[table] = reason
        else:
            reads.extend(outcome)
    if errors:  # a lost source, a full disk...: the batch (or the run) fails, a rerun resumes
        raise errors[0]
    return reads, failed


@dataclass(frozen=True, slots=True)
class _ChunkPaths:
    """Where an attempt at a batch writes each chunk, names its tag makes unique: a Spark job a
    directory of part files (`of`), the driver one file (`file_of`, no directory of its own: a
    small table's read and the run's end would spend more on its directories than on its rows).
    A chunk's recorded ``path`` is either."""

    config: PipelineConfig
    run_id: str
    tag: str

    def of(self, table: str, chunk: ChunkRecord) -> str:
        return run_dir(
            self.config, self.run_id, "snapshot", table, f"chunk-{chunk.index:06d}-{self.tag}"
        )

    def file_of(self, table: str, chunk: ChunkRecord) -> str:
        """Named ``c<index>-<tag>-<table>.parquet``: never with ``_`` or ``.`` first, which would
        hide it from Spark's reads (a database ``_ops``), and unique among the run's files."""
        return run_dir(
            self.config, self.run_id, "snapshot", f"c{chunk.index:06d}-{self.tag}-{table}.parquet"
        )


@dataclass(frozen=True, slots=True)
class _BatchRead:
    """The Spark jobs of one attempt at a batch, a job per table."""

    spark: SparkSession
    config: PipelineConfig
    by_table: Mapping[str, Sequence[ChunkRecord]]
    infos: Mapping[str, TableShape]
    paths: _ChunkPaths  # the attempt's chunk dirs
    guard: Callable[[], None]
    schemas: Mapping[str, pa.Schema]  # each table's data file schema

    def all(self) -> dict[str, list[ChunkRead] | Exception]:
        """Every table's chunks, a job per table, `TABLE_JOBS` jobs at a time; per table what it
        read, or the exception its job raised (so every job ends before the batch decides what a
        failure means)."""
        if len(self.by_table) == 1:
            return {table: _outcome(self.one, table) for table in self.by_table}
        with ThreadPoolExecutor(
            min(TABLE_JOBS, len(self.by_table)), thread_name_prefix="tidemark-table"
        ) as pool:
            futures = {table: pool.submit(_outcome, self.one, table) for table in self.by_table}
        return {table: future.result() for table, future in futures.items()}

    def one(self, table: str) -> list[ChunkRead]:
        """A table's chunks in a job of its own."""
        # pyspark is imported by a run that reads in Spark (not by an incremental run), here
        from orchestrator.pipeline.read.jdbc import read_chunks

        chunks = self.by_table[table]
        paths = {c.index: self.paths.of(table, c) for c in chunks}
        info, key = self.infos[table]
        done = read_chunks(
            self.spark,
            self.config,
            info,
            [(c.index, c.where) for c in chunks],
            paths.__getitem__,
            key,
            guard=self.guard,
            schema=self.schemas[table],
        )
        return [
            ChunkRead(table, i, rows, nbytes, paths[i])
            for i, (rows, nbytes) in sorted(done.items())
        ]


def _outcome(read: Callable[[str], list[ChunkRead]], table: str) -> list[ChunkRead] | Exception:
    """``read(table)``, or the exception it raised (so every job of the batch ends before the
    batch decides what a failure means)."""
    try:
        return read(table)
    except Exception as exc:
        return exc
