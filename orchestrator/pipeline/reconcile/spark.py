"""The Spark engine of reconcile: the same rule as `orchestrator.pipeline.reconcile.local`, as Spark
jobs.

The changes become *events* (key, position, put or delete, row), a window keeps the
last event per key, base rows whose key has an event are dropped (a null-safe anti
join), and the surviving puts are added.

- `reconcile_table`: a whole table (a snapshot whose chunk files do not form the layout, or
  a version without file ranges), written range-partitioned and sorted by key into staging
  files of about `layout.TARGET_FILE_BYTES`;
- `rewrite_slots`: only the slots of the base files that hold changed keys (the territories
  as a broadcast DataFrame, Spark's comparisons), one staging file per rewritten slot in
  ``<slot column>=<slot>/``.

Both write staging types; `orchestrator.pipeline.reconcile.rewrite` turns their output into data
files. Only DataFrame operations are used, so a Spark Connect session runs them too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import FileRange, Territory
from orchestrator.pipeline.changes import (
    DELETE,
    KIND,
    OLD_PREFIX,
    OP,
    POSITION,
    PUT,
    event_key,
    key_names,
)
from orchestrator.pipeline.segments import Changes, segment_files
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import staging_schema, staging_type
from orchestrator.services.spark import (
    apply_required_conf,
    job_description,
    parallelism,
    spark_schema,
    spark_type,
)

log = logging.getLogger(__name__)

#: A snapshot is cut into at least this many bytes of input per file, however small the target.
MIN_FILE_BYTES = 1024 * 1024


def changes_schema(table: TableInfo, key: Sequence[str]) -> T.StructType:
    """The Spark schema of a table's change segments (see the binlog side)."""
    rows = spark_schema(staging_schema(table.columns))
    fields = [T.StructField(name, T.LongType()) for name in POSITION]
    fields.append(T.StructField(OP, T.StringType()))
    fields.extend(rows.fields)
    fields.extend(T.StructField(OLD_PREFIX + k, rows[k].dataType) for k in key)
    return T.StructType(fields)


def _read_changes(
    spark: SparkSession, table: TableInfo, key: Sequence[str], segments: Sequence[str]
) -> DataFrame:
    return spark.read.schema(changes_schema(table, key)).parquet(
        *[storage.spark_uri(p) for p in segments]
    )


def events(changes: DataFrame, table: TableInfo, key: Sequence[str]) -> DataFrame:
    """Changes as events ``(_tm_k<i>..., position, _tm_kind, row columns)``.

    'I'/'U' put the after-image under the new key; 'D' deletes the key of its
    image; a 'U' or 'D' whose old key differs also deletes the old key (a 'D' made of
    an update that left the table's filter: `orchestrator.pipeline.capture.filtering`).
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


def apply_changes(
    base: DataFrame, changes: DataFrame | None, table: TableInfo, key: Sequence[str]
) -> DataFrame:
    """The table at ``H``: base rows without a change, plus the last put of each changed key."""
    if changes is None:
        return base
    last = last_events(events(changes, table, key), len(key))
    return _merge(base, last, [c.name for c in table.columns], key)


def _merge(
    base: DataFrame, last: DataFrame, columns: Sequence[str], key: Sequence[str]
) -> DataFrame:
    """Base rows whose key has no last event, plus the puts among the last events."""
    changed = last.select([event_key(i) for i in range(len(key))])
    condition = None
    for i, k in enumerate(key):
        term = base[k].eqNullSafe(changed[event_key(i)])
        condition = term if condition is None else condition & term
    kept = base.join(changed, on=condition, how="left_anti")
    upserts = last.where(F.col(KIND) == PUT).select(*columns)
    return kept.select(*columns).unionByName(upserts)


def reconcile_table(
    spark: SparkSession,
    table_info: TableInfo,
    key: Sequence[str],
    base_paths: Sequence[str],
    changes: Changes,
    out_dir: str,
    *,
    target_file_bytes: int | None = None,
) -> int:
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
    key = key_names(table_info, key)
    schema = spark_schema(staging_schema(table_info.columns))
    base = (
        spark.read.schema(schema).parquet(*[storage.spark_uri(p) for p in base_paths])
        if base_paths
        else spark.createDataFrame([], schema)
    )
    segments = segment_files(changes)
    frame = _read_changes(spark, table_info, key, segments) if segments else None
    result = apply_changes(base, frame, table_info, key)
    nbytes = storage.tree_bytes([*base_paths, *segments])
    wanted = math.ceil(nbytes / (target_file_bytes or layout.TARGET_FILE_BYTES))
    cap = max(4 * parallelism(spark), nbytes // MIN_FILE_BYTES)
    files = max(1, min(wanted, cap))
    job_description(spark, f"tidemark reconcile {table_info.name}")
    (
        result.repartitionByRange(files, *[F.col(k).asc_nulls_first() for k in key])
        .sortWithinPartitions(*key)
        .write.mode("overwrite")
        .option("maxRecordsPerFile", 0)
        .parquet(storage.spark_uri(out_dir))
    )
    rows = count_rows(out_dir)
    log.info(
        "table %s: reconciled %d base path(s) and %d change segment(s) into %d rows",
        table_info.name,
        len(base_paths),
        len(segments),
        rows,
    )
    return rows


def rewrite_slots(
    spark: SparkSession,
    table_info: TableInfo,
    key: Sequence[str],
    uris: Sequence[str],
    ranges: Sequence[FileRange],
    segments: Sequence[str],
    out_dir: str,
    slot: str,
) -> list[int]:
    """Rewrite the slots of the base files (``uris``, their ``ranges``) that hold changed keys:
    one staging file sorted by key per rewritten slot that keeps rows, in ``out_dir/<slot>=<n>/``.
    Returns the rewritten slots."""
    apply_required_conf(spark)
    key = key_names(table_info, key)
    job_description(spark, f"tidemark reconcile {table_info.name} (rewrite)")
    changes = _read_changes(spark, table_info, key, segments)
    last = assign_slots(
        spark,
        last_events(events(changes, table_info, key), len(key)),
        table_info,
        key,
        layout.territories(ranges),
        slot,
    ).cache()
    try:
        slots = _affected_slots(last, slot, table_info.name)
        if slots:
            base = _slot_base(spark, table_info, uris, slots, slot)
            result = _merge(base, last, [*[c.name for c in table_info.columns], slot], key)
            (
                result.repartition(len(slots), F.col(slot))
                .sortWithinPartitions(slot, *[F.col(k).asc_nulls_first() for k in key])
                .write.mode("overwrite")
                .partitionBy(slot)
                .parquet(storage.spark_uri(out_dir))
            )
    finally:
        last.unpersist()
    return slots


def _affected_slots(last: DataFrame, slot: str, table: str) -> list[int]:
    found = [row[0] for row in last.select(slot).distinct().collect()]
    if any(s is None for s in found):
        raise RunFailed(
            f"internal: a changed key of {table} fell outside every file range; "
            "re-snapshot the table with tidemark run --snapshot"
        )
    return sorted(int(s) for s in found)


def _slot_base(
    spark: SparkSession, table_info: TableInfo, uris: Sequence[str], slots: Sequence[int], slot: str
) -> DataFrame:
    """The rows of the base files of the rewritten slots, each with its slot (told by its file's
    name: base files have distinct names, data files and chunk files alike)."""
    schema = spark_schema(staging_schema(table_info.columns))
    files = {storage.basename(uris[s]): (uris[s], s) for s in slots if 0 <= s < len(uris)}
    if len(files) != len([s for s in slots if 0 <= s < len(uris)]):
        raise RunFailed(f"internal: two base files of {table_info.name} have the same name; rerun")
    if not files:
        return spark.createDataFrame([], schema).withColumn(slot, F.lit(None).cast(T.IntegerType()))
    slot_of = F.create_map(*[F.lit(x) for name, (_, s) in files.items() for x in (name, s)])
    paths = [storage.spark_uri(uri) for uri, _ in files.values()]
    return (
        spark.read.schema(schema)
        .parquet(*paths)
        .withColumn(slot, slot_of[F.col("_metadata.file_name")])
    )


def _before(a: Sequence[Column], b: Sequence[Column], or_equal: Column) -> Column:
    """Key ``a`` sorts before key ``b`` (or equals it where ``or_equal``), NULL first: the files'
    order."""
    result = or_equal
    for x, y in reversed(list(zip(a, b, strict=True))):
        less = (x.isNull() & y.isNotNull()) | F.coalesce(x < y, F.lit(False))
        result = less | (x.eqNullSafe(y) & result)
    return result


def assign_slots(
    spark: SparkSession,
    last: DataFrame,
    table_info: TableInfo,
    key: Sequence[str],
    territories: Sequence[Territory],
    slot: str,
) -> DataFrame:
    """``last`` (keys in ``_tm_k<i>``) with column ``slot``: the territory that owns each key.

    The territories are a small broadcast DataFrame and the comparison is
    Spark's, the order the files are sorted in, so text keys never meet a Python
    comparison or a collation.
    """
    columns = [table_info.column(k) for k in key]
    types = [spark_type(staging_type(c)) for c in columns]
    n = len(key)
    fields = [T.StructField("_tm_slot_id", T.IntegerType(), False)]
    fields += [
        T.StructField(f"_tm_{side}_{flag}", T.BooleanType(), False)
        for side in ("lo", "hi")
        for flag in ("open", "incl")
    ]
    fields += [
        T.StructField(f"_tm_{side}{i}", t) for side in ("lo", "hi") for i, t in enumerate(types)
    ]
    rows = []
    for t in territories:
        low = layout.staging_key(columns, t.low) if t.low is not None else (None,) * n
        high = layout.staging_key(columns, t.high) if t.high is not None else (None,) * n
        rows.append(
            (t.slot, t.low is None, t.low_inclusive, t.high is None, t.high_inclusive, *low, *high)
        )
    bounds = spark.createDataFrame(rows, T.StructType(fields))
    keys = [F.col(event_key(i)) for i in range(n)]
    lo = [bounds[f"_tm_lo{i}"] for i in range(n)]
    hi = [bounds[f"_tm_hi{i}"] for i in range(n)]
    inside = (bounds["_tm_lo_open"] | _before(lo, keys, bounds["_tm_lo_incl"])) & (
        bounds["_tm_hi_open"] | _before(keys, hi, bounds["_tm_hi_incl"])
    )
    joined = last.join(F.broadcast(bounds), on=inside, how="left")
    return joined.select(*last.columns, F.col("_tm_slot_id").alias(slot))


def count_rows(directory: str, *, recursive: bool = False) -> int:
    """Rows in the Parquet files of a directory, from their footers."""
    total = 0
    for uri in storage.list_files(directory, suffix=".parquet", recursive=recursive):
        total += storage.parquet_rows(uri)
    return total
