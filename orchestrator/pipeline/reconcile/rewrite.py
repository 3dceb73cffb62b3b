"""Reconcile: base files + the binlog changes of a run -> the data files of the table at ``H``
(docs/design.md, step 5).

The rule ("Why it is correct"): for each key, the last change by position
``(_tm_file, _tm_pos, _tm_row)`` wins; a delete removes the key, an insert or update puts
its after-image; an update (or a delete, see `orchestrator.pipeline.capture.filtering`) whose
before-image key differs from its image's key is also a delete of the old key at the same
position; keys without a change keep their base row.

The base is a set of data files, each sorted by key and holding one key range, the ranges
disjoint: a snapshot's chunk files as the read wrote them (`orchestrator.pipeline.read.jdbc`;
chunks are disjoint key ranges), or the published version's files. Each changed key (and each
old key of a key-changing update) goes to the slot of the base file whose range owns it
(`orchestrator.lake.layout`, "Territories"); only those slots are rewritten, every other base
file is kept as it is: a snapshot is read once (single pass), and an incremental version shares
every unchanged file with the previous one. The result is a `layout.VersionPlan` in the
reconciled directory: the version's files in key order, the new ones finished in staging, which
publish moves into the table.

Engines, with the same rule and the same files:

- pyarrow in the driver (`orchestrator.pipeline.reconcile.local`), streaming each rewritten
  file, files in parallel on the cores: the default;
- Spark (`orchestrator.pipeline.reconcile.spark`) when the changes exceed
  `LOCAL_CHANGES_BYTES` (the driver holds them in memory), when on a cluster master the files
  to rewrite exceed `CLUSTER_REWRITE_BYTES`, for a version published without file ranges, and
  for a snapshot whose chunk files do not form the layout (a text key whose collation orders
  otherwise than the files: their ranges overlap): then Spark reconciles the whole table.

The step that runs this rule over a run's tables and records them is
`orchestrator.pipeline.reconcile.step`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from chunking import decode_key
from orchestrator.errors import RunFailed
from orchestrator.lake import layout, readahead, storage
from orchestrator.lake.layout import FileRange, Part, VersionPlan
from orchestrator.lake.manifest import Manifest, newest_field_ids, published_schema, read_manifest
from orchestrator.lake.order import ascending_disjoint, python_key
from orchestrator.lake.writer import (
    FIELD_ID,
    file_range,
    read_published,
    with_field_ids,
    write_parts,
)
from orchestrator.pipeline.changes import key_names
from orchestrator.pipeline.reconcile import local
from orchestrator.pipeline.reconcile.kept import planned_base
from orchestrator.pipeline.segments import Changes, segment_files
from orchestrator.schema.tables import TableInfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from orchestrator.pipeline.reconcile.kept import KeptPlans

log = logging.getLogger(__name__)

#: Change segments above this many bytes are reconciled by Spark: the driver holds the changes
#: (about 25M changed rows of a 10-column table, 3 GiB in memory; zstd segments, half the bytes
#: of the earlier snappy ones for as many rows).
LOCAL_CHANGES_BYTES = 512 * 1024**2
#: On a cluster master, a rewrite reading more than this many bytes of base files runs on
#: Spark's executors; below it (and always on a local master, whose executors share the
#: driver's cores) the driver is faster: no JVM, no shuffle (docs/performance.md).
CLUSTER_REWRITE_BYTES = 16 * 1024**3

Engine = Literal["auto", "spark", "local"]
#: Who rewrites the files: nobody (no change), pyarrow in the driver, or Spark.
Rewriter = Literal["none", "local", "spark"]
#: The session, or a function that starts it (a rewrite in the driver starts none).
SessionFn = Callable[[], "SparkSession"]
#: A base file: where to read it, and its range (``file``: the name the plan keeps it under).
BaseFile = tuple[str, FileRange]
#: A function that gives the file schema (wrapped in `functools.cache`: asked for at most once).
SchemaFn = Callable[[], pa.Schema]


@dataclass(frozen=True, slots=True)
class Target:
    """What a reconcile writes: the table, its key, the file schema (field IDs), and where."""

    table: TableInfo
    key: tuple[str, ...]
    #: The file schema, asked for only when a file is written: it loads the Iceberg table
    #: (`iceberg.data_file_schema`), which a table whose files are all kept does without.
    schema_of: SchemaFn
    out_dir: str
    engine: Engine = "auto"
    cluster: bool = False  # a Spark master with executors of its own (not local)
    #: The change segments' bytes, when the caller listed them (`segments.durable`); None: asked
    #: of the store when the engine is chosen (`_choose`)
    changes_bytes: int | None = None

    @property
    def schema(self) -> pa.Schema:
        return self.schema_of()


def published_ids_first(target: Target, tdir: str, manifest: Manifest) -> Target:
    """``target`` whose file schema, for an incremental run on the version ``manifest``
    describes, comes from that version's newest file when the table's columns did not change
    (`newest_field_ids`: no catalog to open, no Iceberg table to load, about 5 ms a table where
    many tables changed, docs/performance.md); else from ``target``'s own (the Iceberg table's)."""
    fallback = target.schema_of

    def schema() -> pa.Schema:
        found = newest_field_ids(tdir, manifest, published_schema(target.table.columns))
        return fallback() if found is None else found

    return replace(target, schema_of=functools.cache(schema))


def _session(spark: SparkSession | SessionFn) -> SparkSession:
    return spark() if callable(spark) else spark


def reconcile_snapshot(
    spark: SparkSession | SessionFn,
    target: Target,
    chunk_dirs: Sequence[str],
    changes: Changes,
    plans: KeptPlans | None = None,
    *,
    recorded: Mapping[str, Sequence[FileRange]] | None = None,
) -> int:
    """A snapshot: the chunk files are the base; only those whose range received a change are
    rewritten (the rest become the version's files as they are). Returns the rows at ``H``.
    ``plans``: the batch that takes the plan when no file is written (``target.out_dir`` is then
    ``plans.dir_of`` the table: `orchestrator.pipeline.reconcile.kept`); ``recorded``: chunk
    directories whose files the read recorded (`chunk_base`)."""
    base = chunk_base(chunk_dirs, target.key, target.table.name, recorded)
    if base is None:
        log.info(
            "table %s: the chunk files' key ranges overlap in the files' order (a collation that "
            "orders otherwise); Spark reconciles the whole table",
            target.table.name,
        )
        return _whole_with_spark(_session(spark), target, list(chunk_dirs), changes, None)
    return rewrite(spark, target, base, changes, base_version=None, plans=plans)


def reconcile_incremental(
    spark: SparkSession | SessionFn,
    table_info: TableInfo,
    key: Sequence[str],
    tdir: str,
    changes: Changes,
    out_dir: str,
    *,
    engine: Engine = "auto",
    target_file_bytes: int | None = None,
    schema: pa.Schema | SchemaFn | None = None,
    cluster: bool = False,
    planned: int | None = None,
    changes_bytes: int | None = None,
) -> int:
    """Rewrite only the files of the current version that hold changed keys (see the module
    docstring); a version without ``file_ranges`` (published before they existed) is rewritten
    whole, once, by Spark. ``schema``: the file schema (default: the table's published schema
    with field IDs 1, 2, ...; the step passes `iceberg.data_file_schema`, as a function: asked for
    only when a file is written, and not at all when the table's columns did not change:
    `published_ids_first`); ``planned``: the version the run planned the table on
    (`orchestrator.pipeline.reconcile.kept.planned_base`); ``changes_bytes``: the changes' size,
    when known (`Target.changes_bytes`). Returns the rows at ``H``."""
    key = key_names(table_info, key)
    if schema is None:
        schema = with_field_ids(
            published_schema(table_info.columns),
            {c.name: i for i, c in enumerate(table_info.columns, 1)},
        )
    target = Target(
        table_info,
        key,
        functools.cache(schema if callable(schema) else lambda: schema),
        out_dir,
        engine,
        cluster,
        changes_bytes,
    )
    manifest = read_manifest(tdir)
    planned_base(table_info.name, manifest, planned)
    target = published_ids_first(target, tdir, manifest)
    ranges = layout.usable_ranges(manifest["files"], manifest.get("file_ranges"))
    if ranges is None:
        log.info(
            "table %s: version %d has no file ranges; rewriting the whole table once",
            table_info.name,
            manifest["version"],
        )
        paths = [storage.join(tdir, f) for f in manifest["files"]]
        return _whole_with_spark(_session(spark), target, paths, changes, target_file_bytes)
    base = [(storage.join(tdir, r["file"]), r) for r in ranges]
    return rewrite(spark, target, base, changes, base_version=manifest["version"])


def chunk_base(
    chunk_dirs: Sequence[str],
    key: Sequence[str],
    table: str,
    recorded: Mapping[str, Sequence[FileRange]] | None = None,
) -> list[BaseFile] | None:
    """The chunk files of a snapshot, in key order, as base files; None when they do not form
    the layout: a file not written sorted by this release's read (no field IDs), or key ranges
    that overlap in the files' order.

    A chunk's path is a directory of part files (a Spark job's) or its one file (the driver's,
    `orchestrator.pipeline.read.local`). A path in ``recorded`` is not opened: its files are as
    the read recorded them when it wrote them (the driver's reads: sorted, with the field IDs;
    the name is unique to the read attempt and never written again). The others' files are
    listed and each opened for its key range."""
    recorded = recorded or {}
    uris = [u for d in chunk_dirs if d not in recorded for u in storage.parquet_files(d)]

    def describe(uri: str) -> tuple[FileRange, bool]:
        sorted_file = all(
            f.metadata and FIELD_ID in f.metadata for f in storage.parquet_schema(uri)
        )
        return file_range(uri, key), sorted_file

    if len(uris) > 1:
        with ThreadPoolExecutor(8, thread_name_prefix="tidemark-ranges") as pool:
            found = list(pool.map(describe, uris))
    else:  # a small table's one chunk: no pool to start and stop
        found = [describe(uri) for uri in uris]
    described = [(uri, *f) for uri, f in zip(uris, found, strict=True)]
    described += [(r["file"], r, True) for d in chunk_dirs if d in recorded for r in recorded[d]]
    files = [(uri, entry) for uri, entry, sorted_file in described if entry["rows"]]
    if not all(sorted_file for _, entry, sorted_file in described if entry["rows"]):
        log.info(
            "table %s: chunk files without field IDs (read by an older release) are not sorted",
            table,
        )
        return None

    def low(f: BaseFile) -> Any:
        return python_key(decode_key(f[1]["min_key"]) or ())

    files.sort(key=low)
    bounds = [(decode_key(e["min_key"]) or (), decode_key(e["max_key"]) or ()) for _, e in files]
    return files if ascending_disjoint(bounds) else None


def _choose(target: Target, segments: Sequence[str]) -> Rewriter:
    if not segments:
        return "none"
    if target.engine != "auto":
        return target.engine
    size = target.changes_bytes
    if (storage.tree_bytes(segments) if size is None else size) > LOCAL_CHANGES_BYTES:
        return "spark"
    return "local"


def rewrite(
    spark: SparkSession | SessionFn,
    target: Target,
    base: Sequence[BaseFile],
    changes: Changes,
    *,
    base_version: int | None,
    plans: KeptPlans | None = None,
) -> int:
    """Merge the changes into the base files' slots that hold changed keys; write the version's
    new files and its `layout.VersionPlan` to ``target.out_dir`` (the plan to ``plans`` instead
    when no file is written and ``plans`` is given). Returns the rows at ``H``."""
    storage.delete_tree(target.out_dir)
    segments = segment_files(changes)
    rewriter = _choose(target, segments)
    rewritten: dict[int, tuple[int, int]] = {}
    batches_of = _as_written(target)
    if rewriter == "local":
        found = _local_slots(target, base, segments)
        if found is None:
            rewriter = "spark"
        else:
            rewritten, batches_of = found
    if rewriter == "spark":
        rewritten, batches_of = _spark_slots(_session(spark), target, base, segments)
    parts = layout.version_parts(base, rewritten)
    small = (
        layout.SMALL_FILE_BYTES if base_version is not None else 0
    )  # a snapshot's chunks stay as read
    groups = layout.group_parts(parts, small)
    written = [parts[i] for g in groups if len(g) > 1 or parts[g[0]].kept is None for i in g]
    readahead.settle(  # what pyarrow reads here: the rest is Spark's, or stays as it is
        [uri for uri, _ in base], {p.uri for p in written if rewriter == "local" or p.slot is None}
    )
    writes = bool(written)
    schema = target.schema if writes else pa.schema([])  # every file kept as it is: none is written
    files = write_parts(
        target.out_dir,
        parts,
        groups,
        schema,
        target.key,
        batches_of,
        shared=base_version is not None,
    )
    plan = VersionPlan(base_version, tuple(sorted(rewritten)), tuple(files))
    if plans is not None and not writes:
        assert plans.dir_of(target.table.name) == target.out_dir, (
            "the batch names the table's reconciled dir"
        )
        plans.add(target.table.name, plan)
    else:
        layout.write_plan(target.out_dir, plan)
    used = {"none": "no change:", "local": "the driver (pyarrow)", "spark": "Spark"}[rewriter]
    kept = {r["file"] for _, r in base} & {f["file"] for f in files}
    # One line per table at the step's end says it is reconciled; this one only when a file is
    # rewritten.
    log.log(
        logging.INFO if rewritten else logging.DEBUG,
        "table %s: changes fall in %d slot(s) %s; %s rewrote %d of %d file(s) (%d of %d base "
        "rows); version: %s",
        target.table.name,
        len(rewritten),
        sorted(rewritten)[:20],
        used,
        len(base) - len(kept),
        len(base),
        sum(r["rows"] for _, r in base if r["file"] not in kept),
        sum(r["rows"] for _, r in base),
        plan,
    )
    return plan.rows


def _as_written(target: Target) -> Callable[[Part], Any]:
    """How a part that is a finished file is read: its rows as they are."""

    def batches(part: Part) -> Any:
        return read_published(part.uri, target.schema)

    return batches


def _local_slots(
    target: Target, base: Sequence[BaseFile], segments: Sequence[str]
) -> tuple[dict[int, tuple[int, int]], Callable[[Part], Any]] | None:
    """The rewritten slots' sizes and how to read each part, by pyarrow; None when on a
    cluster the files to rewrite are better left to Spark (`CLUSTER_REWRITE_BYTES`)."""
    changes = local.read_changes(segments)
    assert changes is not None
    events = local.last_events(changes, target.table, target.key)
    columns = [target.table.column(k) for k in target.key]
    spans = local.slot_spans(events, columns, [r for _, r in base])
    if (
        target.cluster
        and sum(base[s][1]["bytes"] for s in spans if 0 <= s < len(base)) > CLUSTER_REWRITE_BYTES
    ):
        return None
    rows, nbytes = sum(r["rows"] for _, r in base), sum(r["bytes"] for _, r in base)
    sizes = {}
    for slot, (start, end) in spans.items():
        uri, base_rows = (
            (base[slot][0], base[slot][1]["rows"]) if 0 <= slot < len(base) else ("", 0)
        )
        slice_ = events.slice(start, end - start)
        estimate = base_rows + (end - start)
        row_bytes = nbytes / rows if rows else slice_.nbytes / max(end - start, 1)
        if not layout.SMALL_FILE_BYTES <= estimate * row_bytes <= 2 * layout.TARGET_FILE_BYTES:
            estimate = local.output_rows(
                uri, base_rows, slice_, target.key
            )  # exact: it decides a merge or split
        sizes[slot] = (estimate, round(estimate * row_bytes))

    def batches(part: Part) -> Any:
        if part.slot is None:
            return read_published(part.uri, target.schema)
        start, end = spans[part.slot]
        return local.merged(part.uri, events.slice(start, end - start), target.schema, target.key)

    return sizes, batches


def _spark_slots(
    spark: SparkSession, target: Target, base: Sequence[BaseFile], segments: Sequence[str]
) -> tuple[dict[int, tuple[int, int]], Callable[[Part], Any]]:
    """The rewritten slots by Spark: one staging file per slot that keeps rows."""
    from orchestrator.pipeline.reconcile.spark import (
        rewrite_slots,  # pyspark only when Spark rewrites
    )

    slot = layout.slot_column([c.name for c in target.table.columns])
    spark_dir = storage.join(target.out_dir, "_spark")
    slots = rewrite_slots(
        spark,
        target.table,
        target.key,
        [u for u, _ in base],
        [r for _, r in base],
        segments,
        spark_dir,
        slot,
    )
    rows, nbytes = sum(r["rows"] for _, r in base), sum(r["bytes"] for _, r in base)
    sizes, files = {}, {}
    for s in slots:
        found = [
            u
            for u in storage.list_files(storage.join(spark_dir, f"{slot}={s}"), suffix=".parquet")
            if storage.parquet_rows(u)
        ]
        if len(found) > 1:
            raise RunFailed(
                f"internal: Spark wrote {len(found)} files for slot {s} of {target.table.name}, "
                "the layout needs one; rerun to reconcile again"
            )
        n = storage.parquet_rows(found[0]) if found else 0
        sizes[s] = (
            n,
            round(n * nbytes / rows) if rows else (storage.size(found[0]) if found else 0),
        )
        files[s] = found[0] if found else ""

    def batches(part: Part) -> Any:
        uri = part.uri if part.slot is None else files[part.slot]
        return read_published(uri, target.schema) if uri else iter(())

    return sizes, batches


def _whole_with_spark(
    spark: SparkSession,
    target: Target,
    base_paths: list[str],
    changes: Changes,
    target_file_bytes: int | None,
) -> int:
    """The whole table by Spark (range-partitioned, sorted staging files), then its data files."""
    from orchestrator.pipeline.reconcile.spark import (
        reconcile_table,  # pyspark only when Spark reconciles
    )

    storage.delete_tree(target.out_dir)
    spark_dir = storage.join(target.out_dir, "_spark")
    reconcile_table(
        spark,
        target.table,
        target.key,
        base_paths,
        changes,
        spark_dir,
        target_file_bytes=target_file_bytes,
    )
    uris = [u for u in storage.list_files(spark_dir, suffix=".parquet") if storage.parquet_rows(u)]
    parts = [Part(u, storage.parquet_rows(u), storage.size(u)) for u in uris]
    files = write_parts(
        target.out_dir,
        parts,
        [[i] for i in range(len(parts))],
        target.schema,
        target.key,
        _as_written(target),
        shared=False,
    )
    plan = VersionPlan(None, (), tuple(files))
    layout.write_plan(target.out_dir, plan)
    log.info("table %s: Spark reconciled the whole table: %s", target.table.name, plan)
    return plan.rows
