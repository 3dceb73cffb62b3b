"""What a capture pass needs to derive the run's cascades: the keys planned, the parents outside
the run (captured, never written), where each table's base rows are, and its segments so far.

`run_cascades` reads them from the run's state: each table's ``cascades`` run info (written at
plan, `orchestrator.pipeline.plan.cascades`), its chunks (a snapshot's base) or its published
version (an incremental table's base), and the run's durable segments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.config import PipelineConfig
from orchestrator.lake import storage
from orchestrator.lake.manifest import find_manifest, load_manifest, version_uri
from orchestrator.pipeline.capture.buffer import CaptureTable
from orchestrator.pipeline.capture.cascade_state import BaseSpec
from orchestrator.pipeline.context import position, table_dir, table_info
from orchestrator.pipeline.plan.cascades import CascadeInfo
from orchestrator.pipeline.segments import durable_segments
from orchestrator.schema.cascades import ForeignKey
from orchestrator.schema.tables import TableInfo
from orchestrator.state.store import ChunkRecord, StateStore


@dataclass(frozen=True, slots=True)
class RunCascades:
    """The cascades of a capture pass.

    Attributes:
        keys: the cascading keys of the run's tables (derived ones and those re-read).
        outside: the parents whose rows events are read only for the cascades (not tables of
            the run, or tables of it that failed), by name.
        bases: where a captured table's base rows are.
        segments: a table's durable change segments of the run.
    """

    keys: tuple[ForeignKey, ...]
    outside: Mapping[str, CaptureTable]
    bases: Callable[[str], BaseSpec | None]
    segments: Callable[[str], Sequence[str]]


def run_cascades(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    tables: Mapping[str, CaptureTable],
) -> RunCascades | None:
    """The cascades to derive while capturing ``tables`` (the run's tables being captured); None
    when no key of theirs cascades, or the server logs its cascades itself."""
    records = {r.table: r for r in store.run_tables(run_id)}
    keys: dict[tuple[str, str], ForeignKey] = {}
    shapes: dict[str, TableInfo] = {}
    for name in tables:
        record = records.get(name)
        info = CascadeInfo.from_json(record.info.get("cascades")) if record is not None else None
        if info is None or info.mode != "derive":
            continue
        for key in info.keys:
            keys.setdefault((key.child, key.name), key)
        shapes |= info.outside
    if not keys:
        return None
    begin = min(t.start for t in tables.values())
    outside = {}
    for key in keys.values():
        for name in (key.parent, key.child):
            if name in tables or name in outside:
                continue
            record = records.get(name)
            shape = (
                table_info(record)
                if record is not None and "table_info" in record.info
                else shapes.get(name)
            )
            if shape is None:
                continue  # its shape is unknown: the keys through it are re-read
            referenced = [k.referenced for k in keys.values() if k.parent == name]
            key_columns = tuple(dict.fromkeys(c for cols in referenced for c in cols))
            outside[name] = CaptureTable(
                info=shape, key=key_columns or shape.primary_key, start=begin, published=False
            )
    chunks: dict[str, list[ChunkRecord]] = {}
    for chunk in store.chunks(run_id):
        if chunk.table in tables and chunk.path:
            chunks.setdefault(chunk.table, []).append(chunk)
    segments = durable_segments(store, config.staging_path, run_id)

    def bases(name: str) -> BaseSpec | None:
        record = records.get(name)
        if record is None or name not in tables:
            return None
        complete = None if config.table_where(name) else tables[name].start.key
        if record.mode == "snapshot":
            mine = chunks.get(name, [])
            files = [f for c in mine for f in storage.parquet_files(c.path or "")]
            highs = [position(c.high).key for c in mine if c.high]
            if complete is not None:
                complete = max(highs, default=complete)
            return BaseSpec(files, complete)
        tdir = table_dir(config, name)  # the version the run planned it on
        version = record.info.get("base_version")
        planned = version_uri(tdir, int(version)) if version is not None else None
        manifest = (
            load_manifest(planned)
            if planned is not None and storage.exists(planned)
            else find_manifest(tdir)
        )
        files = [storage.join(tdir, f) for f in manifest["files"]] if manifest else []
        if complete is not None and manifest:
            # its rows are the version's, whose position a start held back for an XA transaction
            # lies before (`orchestrator.pipeline.capture.xa`)
            complete = max(complete, position(dict(manifest["position"])).key)
        return BaseSpec(files, complete)

    return RunCascades(tuple(keys.values()), outside, bases, lambda name: segments.get(name, []))


def with_before(
    tables: Mapping[str, CaptureTable], keys: Sequence[ForeignKey]
) -> dict[str, CaptureTable]:
    """``tables`` with each parent's referenced columns outside its key as `CaptureTable.before`:
    an update's before image of them says which child rows referenced it."""
    out = dict(tables)
    for name, table in tables.items():
        key = {k.lower() for k in table.key}
        referenced = [c for k in keys if k.parent == name for c in k.referenced]
        extra = tuple(dict.fromkeys(c for c in referenced if c.lower() not in key))
        if extra:
            out[name] = replace(table, before=extra)
    return out
