"""Reconcile: base rows + the binlog changes of a run -> the table at ``H`` (DESIGN.md step 5).

The rule ("Why it is correct"): for each key, the last change by position
``(_tm_file, _tm_pos, _tm_row)`` wins; a delete removes the key, an insert or
update puts its after-image; an update whose before-image key differs from its
after-image key is also a delete of the old key at the same position; keys
without a change keep their base row. The base is the snapshot (every chunk of
the table) or the current published version.

One Spark job: the changes become *events* (key, position, put or delete, row),
a window keeps the last event per key, base rows whose key has an event are
dropped (a null-safe anti join, cheap when the changes are few), the surviving
puts are added, and the result is written range-partitioned and sorted by key
into a few files in staging types.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from orchestrator import storage
from orchestrator.schema import TableInfo
from orchestrator.spark import apply_required_conf, spark_schema
from orchestrator.values import staging_schema

log = logging.getLogger(__name__)

#: Aim for reconciled (and so published) files of about this many bytes of staging Parquet.
TARGET_FILE_BYTES = 128 * 1024 * 1024

POSITION = ("_tm_file", "_tm_pos", "_tm_row")
OP = "_tm_op"
OLD_PREFIX = "_tm_old_"
_KIND = "_tm_kind"  # 1 = put the row, 0 = delete the key
_PUT, _DELETE = 1, 0


def changes_schema(table: TableInfo, key: Sequence[str]) -> T.StructType:
    """The Spark schema of a table's change segments (see the binlog side)."""
    rows = spark_schema(staging_schema(table.columns))
    fields = [T.StructField(name, T.LongType()) for name in POSITION]
    fields.append(T.StructField(OP, T.StringType()))
    fields.extend(rows.fields)
    fields.extend(T.StructField(OLD_PREFIX + k, rows[k].dataType) for k in key)
    return T.StructType(fields)


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
    before image; a 'U' that changes the key also deletes the old key.
    """
    columns = [c.name for c in table.columns]
    schema = spark_schema(staging_schema(table.columns))
    position = [F.col(p) for p in POSITION]
    nulls = [F.lit(None).cast(schema[c].dataType).alias(c) for c in columns]

    def event(keys: Sequence[Column], kind: int, rows: Sequence[Column]) -> list[Column]:
        named = [k.alias(f"_tm_k{i}") for i, k in enumerate(keys)]
        return [*named, *position, F.lit(kind).alias(_KIND), *rows]

    op = F.col(OP)
    new_key = [F.col(k) for k in key]
    old_key = [F.col(OLD_PREFIX + k) for k in key]
    same_key = F.lit(True)
    for old, new in zip(old_key, new_key, strict=True):
        same_key = same_key & old.eqNullSafe(new)
    puts = changes.where(op.isin("I", "U")).select(event(new_key, _PUT, [F.col(c) for c in columns]))
    deletes = changes.where(op == "D").select(event(new_key, _DELETE, nulls))
    moves = changes.where((op == "U") & ~same_key).select(event(old_key, _DELETE, nulls))
    return puts.unionByName(deletes).unionByName(moves)


def last_events(evts: DataFrame, key_count: int) -> DataFrame:
    """The last event of each key (NULL keys compare equal, as a window partition does)."""
    keys = [f"_tm_k{i}" for i in range(key_count)]
    order = [F.col(p).desc() for p in POSITION] + [F.col(_KIND).desc()]
    window = Window.partitionBy(*keys).orderBy(*order)
    return evts.withColumn("_tm_rn", F.row_number().over(window)).where(F.col("_tm_rn") == 1)


def apply_changes(base: DataFrame, changes: DataFrame | None, table: TableInfo,
                  key: Sequence[str]) -> DataFrame:
    """The table at ``H``: base rows without a change, plus the last put of each changed key."""
    if changes is None:
        return base
    columns = [c.name for c in table.columns]
    last = last_events(events(changes, table, key), len(key))
    changed = last.select([f"_tm_k{i}" for i in range(len(key))])
    condition = None
    for i, k in enumerate(key):
        term = base[k].eqNullSafe(changed[f"_tm_k{i}"])
        condition = term if condition is None else condition & term
    kept = base.join(changed, on=condition, how="left_anti")
    upserts = last.where(F.col(_KIND) == _PUT).select(columns)
    return kept.select(columns).unionByName(upserts)


def reconcile_table(spark: SparkSession, table_info: TableInfo, key: Sequence[str],
                    base_paths: Sequence[str], changes_dir: str, out_dir: str,
                    *, target_file_bytes: int = TARGET_FILE_BYTES) -> int:
    """Write the table at ``H`` to ``out_dir`` as staging Parquet, sorted by key.

    Args:
        spark: the session.
        table_info: the table's columns.
        key: the chunk key (primary key or unique NOT NULL key) the changes are keyed on.
        base_paths: Parquet files or directories of the base rows: the snapshot's
            chunk directories, or the current version's files (empty: no base rows).
        changes_dir: the run's change segments of the table; absent or empty means no changes.
        out_dir: where the result goes; replaced if it exists.
        target_file_bytes: about how big each output file should be; there are at
            most four files per core of the session, whatever the size.

    Returns:
        The number of rows written.
    """
    apply_required_conf(spark)
    key = _key_names(table_info, key)
    schema = spark_schema(staging_schema(table_info.columns))
    base = (spark.read.schema(schema).parquet(*[storage.spark_uri(p) for p in base_paths])
            if base_paths else spark.createDataFrame([], schema))
    segments = storage.list_files(changes_dir, suffix=".parquet")
    changes = (spark.read.schema(changes_schema(table_info, key)).parquet(storage.spark_uri(changes_dir))
               if segments else None)
    result = apply_changes(base, changes, table_info, key)
    wanted = math.ceil(_input_bytes([*base_paths, *segments]) / target_file_bytes)
    files = max(1, min(wanted, 4 * spark.sparkContext.defaultParallelism))
    spark.sparkContext.setJobDescription(f"tidemark reconcile {table_info.name}")
    (result.repartitionByRange(files, *[F.col(k).asc_nulls_first() for k in key])
        .sortWithinPartitions(*key)
        .write.mode("overwrite").option("maxRecordsPerFile", 0)
        .parquet(storage.spark_uri(out_dir)))
    rows = count_rows(out_dir)
    log.info("table %s: reconciled %d base path(s) and %d change segment(s) into %d rows",
             table_info.name, len(base_paths), len(segments), rows)
    return rows


def count_rows(directory: str) -> int:
    """Rows in the Parquet files of a directory, from their footers."""
    total = 0
    for uri in storage.list_files(directory, suffix=".parquet"):
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as handle:
            total += pq.read_metadata(handle).num_rows
    return total
