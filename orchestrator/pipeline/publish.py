"""Publish: a reconciled table becomes a new immutable version behind an atomic manifest switch.

Layout and manifest are CONTRACT.md's "Output layout". Order of writes:

1. the version's new data files ``data/v000002-c0000.parquet`` ..., converted from
   staging types to published types with pyarrow, record batch by record batch,
   each one key range in key order (`orchestrator.lake.layout`); after an incremental
   reconcile only the rewritten ranges are new and every other file of the
   previous version is shared (listed again, never copied);
2. ``_tidemark/versions/000002.json``;
3. ``_tidemark/current.json``, replaced atomically (`storage.write_atomic`):
   the moment readers switch to the new version;
4. retention: versions beyond ``output.keep_versions`` are dropped, with the
   files no kept version references.

A crash before 3 leaves the previous version current and some unreferenced
files of the new version number; the rerun deletes those and writes them again.
A crash after 3 is detected by the rerun (``current.json`` already carries the
run id) and returns the published manifest.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Sequence
from typing import NotRequired, TypedDict

import pyarrow as pa
import pyarrow.dataset as ds

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import DATA_DIR, FileRange, VersionWriter
from orchestrator.lake.layout import data_file as data_file  # re-exported: part of the publish API
from orchestrator.lake.layout import to_published as to_published
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import arrow_type
from orchestrator.schema.values import staging_nullable

log = logging.getLogger(__name__)

META_DIR = "_tidemark"
_VERSION_FILE = re.compile(r"^(\d{6})\.json$")


class ColumnEntry(TypedDict):
    name: str
    mysql_type: str
    arrow_type: str
    nullable: bool


class PositionEntry(TypedDict):
    file: str
    pos: int
    gtid_set: str | None


class Manifest(TypedDict):
    """CONTRACT.md's ``current.json``, field for field, plus ``file_ranges`` (README "Output"):
    per file of ``files``, in the same order, its first and last key, rows and bytes.
    Manifests written before ``file_ranges`` existed lack it."""

    table: str
    version: int
    files: list[str]
    position: PositionEntry
    rows: int
    columns: list[ColumnEntry]
    chunk_key: list[str]
    published_at: str
    run_id: str
    file_ranges: NotRequired[list[FileRange]]


# --------------------------------------------------------------------------- paths and schema


def table_dir(config: PipelineConfig, table: TableInfo) -> str:
    """``<output.path>/<database>/<table>``."""
    return storage.join(config.output.path, table.database, table.table)


def current_uri(tdir: str) -> str:
    return storage.join(tdir, META_DIR, "current.json")


def version_uri(tdir: str, version: int) -> str:
    return storage.join(tdir, META_DIR, "versions", f"{version:06d}.json")


def published_field(column: ColumnInfo) -> pa.Field:
    """A published column: CONTRACT type, MySQL type in metadata; zero dates make it nullable."""
    return pa.field(column.name, arrow_type(column), nullable=staging_nullable(column),
                    metadata={"mysql_type": column.column_type})


def published_schema(columns: Sequence[ColumnInfo]) -> pa.Schema:
    return pa.schema(published_field(c) for c in columns)


def column_entries(columns: Sequence[ColumnInfo]) -> list[ColumnEntry]:
    return [ColumnEntry(name=c.name, mysql_type=c.column_type, arrow_type=str(arrow_type(c)),
                        nullable=staging_nullable(c)) for c in columns]


# --------------------------------------------------------------------------- manifests


def find_manifest(tdir: str) -> Manifest | None:
    """The current manifest of a table dir, or None when nothing is published there."""
    uri = current_uri(tdir)
    if not storage.exists(uri):
        return None
    return _load(uri)


def read_manifest(tdir: str) -> Manifest:
    """The current manifest of a table dir.

    Raises:
        RunFailed: nothing is published there.
    """
    manifest = find_manifest(tdir)
    if manifest is None:
        raise RunFailed(f"{tdir} holds no published table ({META_DIR}/current.json is missing); "
                        "snapshot it with tidemark run --snapshot")
    return manifest


def _load(uri: str) -> Manifest:
    try:
        data: Manifest = json.loads(storage.read_bytes(uri))
    except (ValueError, OSError) as exc:
        raise RunFailed(f"cannot read manifest {uri}: {exc}") from exc
    return data


def manifest_json(manifest: Manifest) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()


def read_published(tdir: str) -> pa.Table:
    """The current version of a table as one Arrow table (reads every file of the manifest)."""
    manifest = read_manifest(tdir)
    uris = [storage.join(tdir, f) for f in manifest["files"]]
    fs, _ = storage.filesystem(tdir)
    dataset = ds.dataset([storage.filesystem(u)[1] for u in uris], format="parquet", filesystem=fs)
    return dataset.to_table()


# --------------------------------------------------------------------------- publish


def publish_table(config: PipelineConfig, table_info: TableInfo, key: Sequence[str],
                  reconciled_dir: str, position: BinlogPosition, run_id: str) -> Manifest:
    """Publish a reconciled table as the next version and switch its manifest to it.

    Args:
        config: the pipeline config (``output.path``, ``output.keep_versions``).
        table_info: the table's columns.
        key: the chunk key, recorded in the manifest.
        reconciled_dir: staging Parquet files of the table at ``position``, or the
            rewritten slots and `layout.RewritePlan` of an incremental reconcile.
        position: ``H``, the binlog position the data equals the source at.
        run_id: the run publishing; publishing the same run again returns its manifest.

    Returns:
        The manifest now in ``current.json``.
    """
    tdir = table_dir(config, table_info)
    current = find_manifest(tdir)
    if current is not None and current["run_id"] == run_id:
        log.info("table %s: version %d of run %s is already published", table_info.name,
                 current["version"], run_id)
        apply_retention(tdir, config.output.keep_versions)
        return current
    version = current["version"] + 1 if current is not None else 1
    _delete_partial(tdir, version)
    writer = VersionWriter(tdir, version, published_schema(table_info.columns),
                           [table_info.column(k).name for k in key])
    plan = layout.read_plan(reconciled_dir)
    if plan is None:
        ranges = writer.write_all(reconciled_dir)
    else:
        if current is None or current["version"] != plan.base_version:
            raise RunFailed(f"table {table_info.name}: the run reconciled against version {plan.base_version} "
                            f"but version {current['version'] if current else 'none'} is current; "
                            f"re-snapshot it: tidemark run --table {table_info.name} --snapshot")
        base = layout.usable_ranges(current["files"], current.get("file_ranges"))
        if base is None:
            raise RunFailed(f"internal: version {current['version']} of {table_info.name} has no file "
                            "ranges but the reconcile planned a partial rewrite; rerun with --snapshot")
        ranges = writer.write_incremental(reconciled_dir, plan, base)
    if not ranges:
        ranges = [writer.write_empty()]
    rows = sum(r["rows"] for r in ranges)
    manifest = Manifest(
        table=table_info.name, version=version, files=[r["file"] for r in ranges],
        position=PositionEntry(file=position.file, pos=position.pos, gtid_set=position.gtid_set),
        rows=rows, columns=column_entries(table_info.columns), chunk_key=list(key),
        published_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), run_id=run_id,
        file_ranges=ranges,
    )
    body = manifest_json(manifest)
    storage.write_atomic(version_uri(tdir, version), body)
    storage.write_atomic(current_uri(tdir), body)
    log.info("table %s: published version %d (%d rows, %d files: %d new holding %d rows, %d shared) at %s",
             table_info.name, version, rows, len(ranges), writer.files_written, writer.rows_written,
             len(ranges) - writer.files_written, position)
    apply_retention(tdir, config.output.keep_versions)
    return manifest


def _delete_partial(tdir: str, version: int) -> None:
    """Remove files of ``version`` left by an earlier attempt that never switched the manifest."""
    prefix = f"v{version:06d}-"
    for uri in storage.list_files(storage.join(tdir, DATA_DIR)):
        if storage.basename(uri).startswith(prefix):
            storage.delete_file(uri)


# --------------------------------------------------------------------------- retention


def version_numbers(tdir: str) -> list[int]:
    """Versions with a manifest under ``_tidemark/versions``, ascending."""
    found = []
    for uri in storage.list_files(storage.join(tdir, META_DIR, "versions"), suffix=".json"):
        match = _VERSION_FILE.match(storage.basename(uri))
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def files_to_drop(manifests: dict[int, Manifest], keep: int) -> tuple[list[int], list[str]]:
    """Which versions retention drops and which of their files no kept version uses.

    >>> m = lambda v, files: {"version": v, "files": files}
    >>> files_to_drop({1: m(1, ["a", "b"]), 2: m(2, ["b", "c"]), 3: m(3, ["c", "d"])}, 2)
    ([1], ['a'])
    """
    versions = sorted(manifests)
    dropped = versions[:-keep] if keep < len(versions) else []
    kept_files = {f for v in versions if v not in dropped for f in manifests[v]["files"]}
    garbage = sorted({f for v in dropped for f in manifests[v]["files"]} - kept_files)
    return dropped, garbage


def apply_retention(tdir: str, keep: int) -> list[int]:
    """Keep the newest ``keep`` versions (the current one always); returns the dropped versions."""
    current = find_manifest(tdir)
    manifests = {v: _load(version_uri(tdir, v)) for v in version_numbers(tdir)}
    if current is not None:
        manifests[current["version"]] = current
        manifests = {v: m for v, m in manifests.items() if v <= current["version"]}
    dropped, garbage = files_to_drop(manifests, max(1, keep))
    for relative in garbage:
        storage.delete_file(storage.join(tdir, relative))
    for version in dropped:
        storage.delete_file(version_uri(tdir, version))
    if dropped:
        log.info("%s: retention dropped version(s) %s and %d file(s)", tdir,
                 ", ".join(map(str, dropped)), len(garbage))
    return dropped
