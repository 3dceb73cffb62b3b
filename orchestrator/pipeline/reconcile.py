"""Reconcile: base rows + the binlog changes of a run -> the table at ``H`` (DESIGN.md step 5).

The rule ("Why it is correct"): for each key, the last change by position
``(_tm_file, _tm_pos, _tm_row)`` wins; a delete removes the key, an insert or
update puts its after-image; an update (or a delete, see
`orchestrator.pipeline.filtering`) whose before-image key differs from its image's key
is also a delete of the old key at the same position; keys
without a change keep their base row. The base is the snapshot (every chunk of
the table) or the current published version.

One Spark job: the changes become *events* (key, position, put or delete, row),
a window keeps the last event per key, base rows whose key has an event are
dropped (a null-safe anti join, cheap when the changes are few), the surviving
puts are added, and the result is written range-partitioned and sorted by key
into files of about `layout.TARGET_FILE_BYTES` in staging types.

An incremental run (`reconcile_incremental`) does the same on the files of the
published version that hold changed keys only: each changed key (and each old
key of a key-changing update) goes to the slot of the base file whose range owns
it (`orchestrator.lake.layout`, "Territories"), just those files are read, and one
sorted file is written per rewritten slot; publish then shares every other file
with the previous version. Two engines run that rewrite, with the same rule and
the same output: Spark (the ranges as a broadcast DataFrame, Spark's comparisons),
and, when the rewrite reads little (`LOCAL_REWRITE_BYTES`) and every key column is
NOT NULL of a type pyarrow orders as Spark does (integers, decimals, text and
binary bytewise, TIME), pyarrow in the driver: a fresh JVM's start and warm-up
cost far more than the rewrite of a small change set, so such a run never starts
Spark (`orchestrator.pipeline.reconcile_local`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import FileRange, RewritePlan, Territory
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.changes import DELETE, KIND, OLD_PREFIX, OP, POSITION, PUT, event_key
from orchestrator.pipeline.context import open_store, run_dir, spark_session, table_dir, table_info
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.reconcile_local import local_rewrite_allowed, rewrite_locally
from orchestrator.pipeline.segments import Changes, segment_files, segment_paths
from orchestrator.runtime import faults
from orchestrator.runtime.spark import apply_required_conf, spark_schema, spark_type
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import staging_schema, staging_type
from orchestrator.state.store import RunTableRecord, StateStore

log = logging.getLogger(__name__)

#: A snapshot is cut into at least this many bytes of input per file, however small the target.
MIN_FILE_BYTES = 1024 * 1024
#: An incremental rewrite reading at most this many bytes (changes, then base files) runs in the
#: driver with pyarrow (`orchestrator.pipeline.reconcile_local`): a fresh JVM's start and warm-up cost far more than
#: the work of a small change set.
LOCAL_REWRITE_BYTES = 128 * 1024 * 1024

Engine = Literal["auto", "spark", "local"]
#: Who rewrites an incremental run's files: nobody (no change), pyarrow in the driver, or Spark.
Rewriter = Literal["none", "local", "spark"]



def _choose_rewriter(table_info: TableInfo, key: Sequence[str], segments: Sequence[str],
                     engine: Engine) -> Rewriter:
    """The local engine when the key types allow it and the changes are small (or it is asked
    for), Spark otherwise; nobody when there are no changes."""
    if not segments:
        return "none"
    if engine == "spark":
        return "spark"
    local = local_rewrite_allowed(table_info, key)
    if engine == "local" and not local:
        raise ValueError(f"table {table_info.name}: key {tuple(key)} needs the Spark rewrite")
    if local and (engine == "local" or _input_bytes(segments) <= LOCAL_REWRITE_BYTES):
        return "local"
    return "spark"


def changes_schema(table: TableInfo, key: Sequence[str]) -> T.StructType:
    """The Spark schema of a table's change segments (see the binlog side)."""
    rows = spark_schema(staging_schema(table.columns))
    fields = [T.StructField(name, T.LongType()) for name in POSITION]
    fields.append(T.StructField(OP, T.StringType()))
    fields.extend(rows.fields)
    fields.extend(T.StructField(OLD_PREFIX + k, rows[k].dataType) for k in key)
    return T.StructType(fields)


def _read_changes(spark: SparkSession, table: TableInfo, key: Sequence[str], segments: Sequence[str]) -> DataFrame:
    return spark.read.schema(changes_schema(table, key)).parquet(*[storage.spark_uri(p) for p in segments])


def _key_names(table: TableInfo, key: Sequence[str]) -> tuple[str, ...]:
    """The key as the table spells its columns."""
    if not key:
        raise ValueError(f"table {table.name}: reconcile needs a chunk key")
    return tuple(table.column(k).name for k in key)


def _input_bytes(paths: Sequence[str]) -> int:
    total = 0
    for path in paths:
        if storage.is_file(path):
            total += storage.size(path)
        else:
            total += sum(storage.size(f) for f in storage.list_files(path, suffix=".parquet",
                                                                     recursive=True))
    return total


def events(changes: DataFrame, table: TableInfo, key: Sequence[str]) -> DataFrame:
    """Changes as events ``(_tm_k<i>..., position, _tm_kind, row columns)``.

    'I'/'U' put the after-image under the new key; 'D' deletes the key of its
    image; a 'U' or 'D' whose old key differs also deletes the old key (a 'D' made of
    an update that left the table's filter: `orchestrator.pipeline.filtering`).
    """
    columns = [c.name for c in table.columns]
    schema = spark_schema(staging_schema(table.columns))
    position = [F.col(p) for p in POSITION]
    nulls = [F.lit(None).cast(schema[c].dataType).alias(c) for c in columns]

    def event(keys: Sequence[Column], kind: int, rows: Sequence[Column]) -> list[Column]:
        named = [k.alias(event_key(i)) for i, k in enumerate(keys)]
        return [*named, *position, F.lit(kind).alias(KIND), *rows]

    op = F.col(OP)
    new_key = [F.col(k) for k in key]
    old_key = [F.col(OLD_PREFIX + k) for k in key]
    same_key = F.lit(True)
    for old, new in zip(old_key, new_key, strict=True):
        same_key = same_key & old.eqNullSafe(new)
    puts = changes.where(op.isin("I", "U")).select(event(new_key, PUT, [F.col(c) for c in columns]))
    deletes = changes.where(op == "D").select(event(new_key, DELETE, nulls))
    moves = changes.where(op.isin("U", "D") & ~same_key).select(event(old_key, DELETE, nulls))
    return puts.unionByName(deletes).unionByName(moves)


def last_events(evts: DataFrame, key_count: int) -> DataFrame:
    """The last event of each key (NULL keys compare equal, as a window partition does)."""
    keys = [event_key(i) for i in range(key_count)]
    order = [F.col(p).desc() for p in POSITION] + [F.col(KIND).desc()]
    window = Window.partitionBy(*keys).orderBy(*order)
    return evts.withColumn("_tm_rn", F.row_number().over(window)).where(F.col("_tm_rn") == 1)


def apply_changes(base: DataFrame, changes: DataFrame | None, table: TableInfo,
                  key: Sequence[str]) -> DataFrame:
    """The table at ``H``: base rows without a change, plus the last put of each changed key."""
    if changes is None:
        return base
    last = last_events(events(changes, table, key), len(key))
    return _merge(base, last, [c.name for c in table.columns], key)


def _merge(base: DataFrame, last: DataFrame, columns: Sequence[str], key: Sequence[str]) -> DataFrame:
    """Base rows whose key has no last event, plus the puts among the last events."""
    changed = last.select([event_key(i) for i in range(len(key))])
    condition = None
    for i, k in enumerate(key):
        term = base[k].eqNullSafe(changed[event_key(i)])
        condition = term if condition is None else condition & term
    kept = base.join(changed, on=condition, how="left_anti")
    upserts = last.where(F.col(KIND) == PUT).select(*columns)
    return kept.select(*columns).unionByName(upserts)


def reconcile_table(spark: SparkSession, table_info: TableInfo, key: Sequence[str],
                    base_paths: Sequence[str], changes: Changes, out_dir: str,
                    *, target_file_bytes: int | None = None) -> int:
    """Write the table at ``H`` to ``out_dir`` as staging Parquet, sorted by key.

    Args:
        spark: the session.
        table_info: the table's columns.
        key: the chunk key (primary key or unique NOT NULL key) the changes are keyed on.
        base_paths: Parquet files or directories of the base rows: the snapshot's
            chunk directories, or the current version's files (empty: no base rows).
        changes: the table's change segments (`segment_files`); none means no changes.
        out_dir: where the result goes; replaced if it exists.
        target_file_bytes: about how big each output file should be (default
            `layout.TARGET_FILE_BYTES`); never more than one file per `MIN_FILE_BYTES`
            of input, except that up to four files per core are always allowed.

    Returns:
        The number of rows written.
    """
    apply_required_conf(spark)
    key = _key_names(table_info, key)
    schema = spark_schema(staging_schema(table_info.columns))
    base = (spark.read.schema(schema).parquet(*[storage.spark_uri(p) for p in base_paths])
            if base_paths else spark.createDataFrame([], schema))
    segments = segment_files(changes)
    frame = _read_changes(spark, table_info, key, segments) if segments else None
    result = apply_changes(base, frame, table_info, key)
    input_bytes = _input_bytes([*base_paths, *segments])
    wanted = math.ceil(input_bytes / (target_file_bytes or layout.TARGET_FILE_BYTES))
    cap = max(4 * spark.sparkContext.defaultParallelism, input_bytes // MIN_FILE_BYTES)
    files = max(1, min(wanted, cap))
    spark.sparkContext.setJobDescription(f"tidemark reconcile {table_info.name}")
    (result.repartitionByRange(files, *[F.col(k).asc_nulls_first() for k in key])
        .sortWithinPartitions(*key)
        .write.mode("overwrite").option("maxRecordsPerFile", 0)
        .parquet(storage.spark_uri(out_dir)))
    rows = count_rows(out_dir)
    log.info("table %s: reconciled %d base path(s) and %d change segment(s) into %d rows",
             table_info.name, len(base_paths), len(segments), rows)
    return rows


def reconcile_incremental(spark: SparkSession | Callable[[], SparkSession], table_info: TableInfo,
                          key: Sequence[str], table_dir: str, changes: Changes, out_dir: str, *,
                          engine: Engine = "auto", target_file_bytes: int | None = None) -> int:
    """Rewrite only the files of the current version that hold changed keys.

    Writes ``out_dir/<slot column>=<slot>/`` (one file sorted by key per
    rewritten slot that keeps rows) and the `layout.RewritePlan` that publish
    turns into a version sharing every other file. A version without
    ``file_ranges`` (published before they existed) is rewritten whole, once.

    Args:
        spark: the session, or a function that starts it: a rewrite small enough for
            the driver (`LOCAL_REWRITE_BYTES`) runs without Spark.
        table_info: the table's columns.
        key: the chunk key the changes are keyed on.
        table_dir: the published table (its ``current.json`` is the base).
        changes: the table's change segments (`segment_files`).
        out_dir: where the result goes; replaced if it exists.
        engine: ``"auto"`` (local when the keys and sizes allow, Spark otherwise),
            ``"spark"``, or ``"local"`` (ValueError when the key types do not allow it).
        target_file_bytes: for the one-off whole rewrite (see `reconcile_table`).

    Returns:
        The number of rows of the table at ``H``.
    """
    def session() -> SparkSession:
        active = spark if isinstance(spark, SparkSession) else spark()
        apply_required_conf(active)
        return active

    manifest = read_manifest(table_dir)
    ranges = layout.usable_ranges(manifest["files"], manifest.get("file_ranges"))
    if ranges is None:
        log.info("table %s: version %d has no file ranges; rewriting the whole table once",
                 table_info.name, manifest["version"])
        paths = [storage.join(table_dir, f) for f in manifest["files"]]
        return reconcile_table(session(), table_info, key, paths, changes, out_dir,
                               target_file_bytes=target_file_bytes)
    key = _key_names(table_info, key)
    slot = layout.slot_column([c.name for c in table_info.columns])
    storage.delete_tree(out_dir)
    segments = segment_files(changes)
    rewriter = _choose_rewriter(table_info, key, segments, engine)
    slots: list[int] | None = None
    match rewriter:
        case "none":
            slots, used = [], "no change:"
        case "local":
            limit = None if engine == "local" else LOCAL_REWRITE_BYTES
            # None: the base files to read are over the limit after all; Spark does it.
            slots = rewrite_locally(table_info, key, table_dir, ranges, segments, out_dir, slot, limit)
            used = "the driver (pyarrow)"
    if slots is None:
        slots = _rewrite_with_spark(session(), table_info, key, table_dir, ranges, segments, out_dir, slot)
        used = "Spark"
    layout.write_plan(out_dir, RewritePlan(manifest["version"], tuple(slots), slot))
    rewritten = [ranges[s] for s in slots if 0 <= s < len(ranges)]
    rows = sum(r["rows"] for r in ranges) - sum(r["rows"] for r in rewritten)
    rows += count_rows(out_dir, recursive=True)
    log.info("table %s: changes fall in %d slot(s) %s; %s rewrote %d of %d file(s) (%d of %d base rows), "
             "%d rows at H", table_info.name, len(slots), slots[:20], used, len(rewritten), len(ranges),
             sum(r["rows"] for r in rewritten), sum(r["rows"] for r in ranges), rows)
    return rows


def _rewrite_with_spark(spark: SparkSession, table_info: TableInfo, key: Sequence[str], table_dir: str,
                        ranges: Sequence[FileRange], segments: Sequence[str], out_dir: str, slot: str) -> list[int]:
    """The rewritten slots' files, by Spark; returns the rewritten slots."""
    spark.sparkContext.setJobDescription(f"tidemark reconcile {table_info.name} (incremental)")
    changes = _read_changes(spark, table_info, key, segments)
    last = assign_slots(spark, last_events(events(changes, table_info, key), len(key)), table_info, key,
                        layout.territories(ranges), slot).cache()
    try:
        slots = _affected_slots(last, slot, table_info.name)
        if slots:
            base = _slot_base(spark, table_info, table_dir, ranges, slots, slot)
            result = _merge(base, last, [*[c.name for c in table_info.columns], slot], key)
            (result.repartition(len(slots), F.col(slot))
                .sortWithinPartitions(slot, *[F.col(k).asc_nulls_first() for k in key])
                .write.mode("overwrite").partitionBy(slot).parquet(storage.spark_uri(out_dir)))
    finally:
        last.unpersist()
    return slots


def _affected_slots(last: DataFrame, slot: str, table: str) -> list[int]:
    found = [row[0] for row in last.select(slot).distinct().collect()]
    if any(s is None for s in found):
        raise RunFailed(f"internal: a changed key of {table} fell outside every file range; "
                        "re-snapshot the table with tidemark run --snapshot")
    return sorted(int(s) for s in found)


def _slot_base(spark: SparkSession, table_info: TableInfo, table_dir: str, ranges: Sequence[FileRange],
               slots: Sequence[int], slot: str) -> DataFrame:
    """The rows of the base files of the rewritten slots, each with its slot."""
    schema = spark_schema(staging_schema(table_info.columns))
    files = {storage.basename(ranges[s]["file"]): (ranges[s]["file"], s) for s in slots if 0 <= s < len(ranges)}
    if not files:
        return spark.createDataFrame([], schema).withColumn(slot, F.lit(None).cast(T.IntegerType()))
    slot_of = F.create_map(*[F.lit(x) for name, (_, s) in files.items() for x in (name, s)])
    uris = [storage.spark_uri(storage.join(table_dir, path)) for path, _ in files.values()]
    return spark.read.schema(schema).parquet(*uris).withColumn(slot, slot_of[F.col("_metadata.file_name")])


def _before(a: Sequence[Column], b: Sequence[Column], or_equal: Column) -> Column:
    """Key ``a`` sorts before key ``b`` (or equals it where ``or_equal``), NULL first: the files' order."""
    result = or_equal
    for x, y in reversed(list(zip(a, b, strict=True))):
        less = (x.isNull() & y.isNotNull()) | F.coalesce(x < y, F.lit(False))
        result = less | (x.eqNullSafe(y) & result)
    return result


def assign_slots(spark: SparkSession, last: DataFrame, table_info: TableInfo, key: Sequence[str],
                 territories: Sequence[Territory], slot: str) -> DataFrame:
    """``last`` (keys in ``_tm_k<i>``) with column ``slot``: the territory that owns each key.

    The territories are a small broadcast DataFrame and the comparison is
    Spark's, the order the files are sorted in, so text keys never meet a Python
    comparison or a collation.
    """
    columns = [table_info.column(k) for k in key]
    types = [spark_type(staging_type(c)) for c in columns]
    n = len(key)
    fields = [T.StructField("_tm_slot_id", T.IntegerType(), False)]
    fields += [T.StructField(f"_tm_{side}_{flag}", T.BooleanType(), False)
               for side in ("lo", "hi") for flag in ("open", "incl")]
    fields += [T.StructField(f"_tm_{side}{i}", t) for side in ("lo", "hi") for i, t in enumerate(types)]
    rows = []
    for t in territories:
        low = layout.staging_key(columns, t.low) if t.low is not None else (None,) * n
        high = layout.staging_key(columns, t.high) if t.high is not None else (None,) * n
        rows.append((t.slot, t.low is None, t.low_inclusive, t.high is None, t.high_inclusive, *low, *high))
    bounds = spark.createDataFrame(rows, T.StructType(fields))
    keys = [F.col(event_key(i)) for i in range(n)]
    lo = [bounds[f"_tm_lo{i}"] for i in range(n)]
    hi = [bounds[f"_tm_hi{i}"] for i in range(n)]
    inside = ((bounds["_tm_lo_open"] | _before(lo, keys, bounds["_tm_lo_incl"]))
              & (bounds["_tm_hi_open"] | _before(keys, hi, bounds["_tm_hi_incl"])))
    joined = last.join(F.broadcast(bounds), on=inside, how="left")
    return joined.select(*last.columns, F.col("_tm_slot_id").alias(slot))


def count_rows(directory: str, *, recursive: bool = False) -> int:
    """Rows in the Parquet files of a directory, from their footers."""
    total = 0
    for uri in storage.list_files(directory, suffix=".parquet", recursive=recursive):
        total += storage.parquet_rows(uri)
    return total


# --------------------------------------------------------------------------- the step


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """Rows per table at ``H``, for the tables this call reconciled."""

    rows: dict[str, int]

    def __str__(self) -> str:
        if not self.rows:
            return "nothing to reconcile"
        return "reconciled " + ", ".join(f"{t} ({n} rows)" for t, n in sorted(self.rows.items()))


def _reconcile_one(config: PipelineConfig, store: StateStore, run_id: str, record: RunTableRecord,
                   reconciled: str, spark: SparkSession | None) -> tuple[int, SparkSession | None]:
    """Reconcile one captured table into ``reconciled``; returns its rows and the session
    (started if it needed one)."""
    info = table_info(record)
    changes = segment_paths(store, config.staging_path, run_id, record.table)  # the durable ones only
    store.check_fence()  # a process that lost the pipeline lock writes nothing more
    if record.mode == "snapshot":
        spark = spark or spark_session(config)
        base = [c.path for c in store.chunks(run_id, table=record.table) if c.path]
        return reconcile_table(spark, info, tuple(record.chunk_key), base, changes, reconciled), spark
    # rewrites only the published files that hold changed keys; Spark only if it must
    return reconcile_incremental(spark or (lambda: spark_session(config)), info, tuple(record.chunk_key),
                                 table_dir(config, record.table), changes, reconciled), spark


def reconcile(config: PipelineConfig, run_id: str, *, spark: SparkSession | None = None) -> ReconcileResult:
    """Per table: base rows (snapshot chunks, or the published version) + changes -> the table at H."""
    store = open_store(config)
    try:
        out: dict[str, int] = {}
        for record in store.run_tables(run_id):
            if record.status != "captured":
                continue
            # Unique to this attempt: another process's reconcile (one that lost the lock) never
            # writes where publish reads, and publish reads what the state names.
            out_dir = run_dir(config, run_id, "reconciled", f"{record.table}-{storage.attempt_tag()}")
            try:
                rows, spark = _reconcile_one(config, store, run_id, record, out_dir, spark)
            except Exception as exc:  # one table's own trouble fails that table alone
                if (reason := table_failure(exc)) is None:
                    raise
                fail_table(store, run_id, record.table, "reconcile", reason)
                continue
            store.set_table_status(run_id, record.table, "reconciled", rows=rows,
                                   info={"reconciled_dir": out_dir})
            faults.point("reconcile.table_done")
            out[record.table] = rows
            log.info("table %s: reconciled, %d rows at H", record.table, rows)
        return ReconcileResult(out)
    finally:
        store.close()
