"""A table's manifests: ``current.json``, the kept versions, and retention.

docs/output.md, "Output layout": ``<table dir>/_tidemark/current.json`` names the
current version's files; ``_tidemark/versions/NNNNNN.json`` every kept version;
``_tidemark/pending/NNNNNN-<attempt>.json`` the manifest a publish attempt of a release
before this one wrote before its Iceberg commit (the crash recovery of
`orchestrator.pipeline.publish.versions`; now in the run's staging). Retention drops a
version once it is neither among the newest ``output.keep_versions`` nor younger than
``output.keep_hours`` (a long query may still read it), and deletes a data file only when no
kept version lists it. It also deletes what attempts that never switched the manifest left:
data files and pending manifests of a version no newer than the current one that nothing
lists (no process writes such a version any more, so nothing can come to list them).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import NotRequired, TypedDict

import pyarrow as pa

from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.layout import DATA_DIR, META_DIR, FileRange, current_uri
from orchestrator.lake.writer import FIELD_ID, file_version, with_field_ids
from orchestrator.schema.families import SPATIAL_TYPES
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.types import arrow_type
from orchestrator.schema.values import staging_nullable

log = logging.getLogger(__name__)

_VERSION_FILE = re.compile(r"^(\d{6})\.json$")
_PENDING_FILE = re.compile(r"^(\d{6})-[0-9a-f]+\.json$")


class ColumnEntry(TypedDict):
    """A column of the version (docs/output.md); ``srid`` only for a spatial column: the SRID it
    declares, null when it declares none (its values are OGC WKB, docs/types.md)."""

    name: str
    mysql_type: str
    arrow_type: str
    nullable: bool
    srid: NotRequired[int | None]


class PositionEntry(TypedDict):
    """docs/output.md, "Positions": where the version is, and on which server. Manifests written
    before positions carried their server lack ``server_id`` and ``server_uuid``."""

    file: str
    pos: int
    gtid_set: str | None
    server_id: NotRequired[int | None]
    server_uuid: NotRequired[str | None]


class IcebergEntry(TypedDict):
    """Where the version is an Iceberg snapshot (docs/output.md, "Iceberg")."""

    catalog: str
    identifier: str
    metadata_location: str
    snapshot_id: int


class Manifest(TypedDict):
    """docs/output.md's ``current.json``, field for field, plus ``file_ranges`` (docs/output.md):
    per file of ``files``, in the same order, its first and last key, rows and bytes.
    Manifests written before ``file_ranges`` (or ``iceberg``) existed lack it."""

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
    iceberg: NotRequired[IcebergEntry]


# --------------------------------------------------------------------------- paths and schema


def version_uri(tdir: str, version: int) -> str:
    return storage.join(tdir, META_DIR, "versions", f"{version:06d}.json")


def pending_uri(tdir: str, version: int, attempt: str) -> str:
    """The manifest publish attempt ``attempt`` wrote for ``version`` before its Iceberg commit."""
    return storage.join(tdir, META_DIR, "pending", f"{version:06d}-{attempt}.json")


#: The field metadata key pyiceberg reads an Iceberg field's doc from (a spatial column's SRID).
DOC = b"doc"


def published_field(column: ColumnInfo) -> pa.Field:
    """A published column: its docs/types.md type, the MySQL type in the metadata and, for a
    spatial column, the doc of its Iceberg field (`spatial_doc`); zero dates make it nullable."""
    metadata = {"mysql_type": column.column_type}
    if column.data_type in SPATIAL_TYPES:
        metadata[DOC.decode()] = spatial_doc(column)
    return pa.field(
        column.name, arrow_type(column), nullable=staging_nullable(column), metadata=metadata
    )


def spatial_doc(column: ColumnInfo) -> str:
    """The doc of a spatial column's Iceberg field: what its bytes are and its SRID.

    >>> spatial_doc(ColumnInfo("g", "point", "point", True, srid=4326))
    'OGC WKB; SRID 4326 (MySQL point)'
    >>> spatial_doc(ColumnInfo("g", "geometry", "geometry", True))
    'OGC WKB; no SRID declared (MySQL geometry)'
    """
    srid = "no SRID declared" if column.srid is None else f"SRID {column.srid}"
    return f"OGC WKB; {srid} (MySQL {column.column_type})"


def published_schema(columns: Sequence[ColumnInfo]) -> pa.Schema:
    return pa.schema(published_field(c) for c in columns)


def newest_field_ids(tdir: str, manifest: Manifest, schema: pa.Schema) -> pa.Schema | None:
    """``schema`` (a table's published schema) with the field IDs of the newest data file of the
    version ``manifest`` describes, when that file holds the same columns, in the same order, of
    the same types; None otherwise (a column added, dropped, renamed or retyped since, or a file
    without field IDs): the Iceberg table then tells (`orchestrator.lake.iceberg.planned_schema`).

    Publish wrote that file with the IDs of the table's Iceberg schema, and checks every file it
    publishes against that schema again (`orchestrator.pipeline.publish.staging.place`), so the
    files an incremental run writes with these IDs are published as they are, or rewritten if the
    Iceberg table changed in between. A run whose columns did not change thus writes its files
    without loading the Iceberg table first, or importing pyiceberg (docs/performance.md)."""
    newest = max(
        manifest["files"], key=lambda f: file_version(f.rsplit("/", 1)[-1]) or 0, default=None
    )
    if newest is None:
        return None
    found = storage.parquet_schema(storage.join(tdir, newest))
    if [(f.name, f.type) for f in found] != [(f.name, f.type) for f in schema]:
        return None
    ids = [(f.metadata or {}).get(FIELD_ID) for f in found]
    if not all(ids):
        return None
    return with_field_ids(schema, {f.name: int(i or 0) for f, i in zip(found, ids, strict=True)})


def column_entries(columns: Sequence[ColumnInfo]) -> list[ColumnEntry]:
    """The manifest's ``columns``.

    >>> column_entries([ColumnInfo("p", "point", "point", False, srid=4326)])
    [{'name': 'p', 'mysql_type': 'point', 'arrow_type': 'binary', 'nullable': False, 'srid': 4326}]
    """
    out = []
    for c in columns:
        entry = ColumnEntry(
            name=c.name,
            mysql_type=c.column_type,
            arrow_type=str(arrow_type(c)),
            nullable=staging_nullable(c),
        )
        if c.data_type in SPATIAL_TYPES:
            entry["srid"] = c.srid
        out.append(entry)
    return out


# --------------------------------------------------------------------------- manifests


def find_manifest(tdir: str) -> Manifest | None:
    """The current manifest of a table dir, or None when nothing is published there."""
    uri = current_uri(tdir)
    try:
        data = storage.read_if_exists(uri)
    except OSError as exc:
        raise RunFailed(f"cannot read manifest {uri}: {exc}") from exc
    if data is not None:
        return _decoded(uri, data)
    if not storage.recover_atomic(uri):  # not a switch a crash cut: nothing published
        return None
    return load_manifest(uri)


#: Manifests read at once on an object store (`Manifests`).
READERS = 16


class Manifests:
    """The current manifests of many table dirs, as `find_manifest` gives each: on an object store
    read at once by up to `READERS` threads when the block starts (there each read is two round
    trips, and a step that reads one a table spent them one after the other: 200 tables without
    a change took 20 s at 10 ms a request, docs/performance.md); on a local disk read as asked.
    `find` gives one, or raises what reading it raised (one table's trouble stays its own). The
    block waits for its reads when it ends: no thread of it outlives it.

    >>> with Manifests(["/nowhere/a/b"]) as manifests:
    ...     manifests.find("/nowhere/a/b") is None
    True
    """

    def __init__(self, tdirs: Iterable[str], readers: int | None = None) -> None:
        wanted = list(dict.fromkeys(tdirs))
        remote = any(not storage.is_local(t) for t in wanted)
        count = min(readers or (READERS if remote else 1), len(wanted))
        self._pool = (
            ThreadPoolExecutor(count, thread_name_prefix="tidemark-manifests")
            if count > 1
            else None
        )
        self._reads: dict[str, Future[Manifest | None]] = {}
        if self._pool is not None:
            self._reads = {t: self._pool.submit(find_manifest, t) for t in wanted}

    def find(self, tdir: str) -> Manifest | None:
        """``tdir``'s current manifest (`find_manifest`), read once."""
        read = self._reads.pop(tdir, None)
        return find_manifest(tdir) if read is None else read.result()

    def __enter__(self) -> Manifests:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def read_manifest(tdir: str, find: Callable[[str], Manifest | None] = find_manifest) -> Manifest:
    """The current manifest of a table dir (read by ``find``: `find_manifest`, or
    `Manifests.find`).

    Raises:
        RunFailed: nothing is published there.
    """
    manifest = find(tdir)
    if manifest is None:
        raise RunFailed(
            f"{tdir} holds no published table ({META_DIR}/current.json is missing); "
            "snapshot it with tidemark run --snapshot"
        )
    return manifest


def load_manifest(uri: str) -> Manifest:
    """A manifest file (``current.json`` or a version's)."""
    try:
        data = storage.read_bytes(uri)
    except OSError as exc:
        raise RunFailed(f"cannot read manifest {uri}: {exc}") from exc
    return _decoded(uri, data)


def _decoded(uri: str, data: bytes) -> Manifest:
    try:
        manifest: Manifest = json.loads(data)
    except ValueError as exc:
        raise RunFailed(f"cannot read manifest {uri}: {exc}") from exc
    return manifest


def manifest_json(manifest: Manifest) -> bytes:
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()


def pending_json(manifests: dict[str, Manifest]) -> bytes:
    """The pending manifests of the tables a publish attempt commits together, by table."""
    return (json.dumps(manifests, ensure_ascii=False) + "\n").encode()


def load_pending(uri: str, table: str) -> Manifest | None:
    """``table``'s manifest in a file of `pending_json`; None when the file or the table is not
    there."""
    if not storage.exists(uri):
        return None
    try:
        found: Manifest | None = json.loads(storage.read_bytes(uri)).get(table)
    except (ValueError, OSError) as exc:
        raise RunFailed(f"cannot read the pending manifests {uri}: {exc}") from exc
    return found


def read_published(tdir: str) -> pa.Table:
    """The current version of a table as one Arrow table (reads every file of the manifest)."""
    import pyarrow.dataset as ds  # not by a run, which never reads a table whole (10 ms)

    manifest = read_manifest(tdir)
    uris = [storage.join(tdir, f) for f in manifest["files"]]
    fs, _ = storage.filesystem(tdir)
    dataset = ds.dataset([storage.filesystem(u)[1] for u in uris], format="parquet", filesystem=fs)
    return dataset.to_table()


# --------------------------------------------------------------------------- retention


def version_numbers(tdir: str) -> list[int]:
    """Versions with a manifest under ``_tidemark/versions``, ascending."""
    found = []
    for uri in storage.list_files(storage.join(tdir, META_DIR, "versions"), suffix=".json"):
        match = _VERSION_FILE.match(storage.basename(uri))
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def files_to_drop(
    manifests: dict[int, Manifest], keep: int, keep_after: dt.datetime | None = None
) -> tuple[list[int], list[str]]:
    """Which versions retention drops and which of their files no kept version uses: a
    version is dropped when it is not among the newest ``keep`` and was published before
    ``keep_after`` (a query started on it may still be reading its files).

    >>> m = lambda v, files, at="2026-11-20T10:00:00Z": {"version": v, "files": files,
    ...                                                  "published_at": at}
    >>> files_to_drop({1: m(1, ["a", "b"]), 2: m(2, ["b", "c"]), 3: m(3, ["c", "d"])}, 2)
    ([1], ['a'])
    >>> files_to_drop({1: m(1, ["a"]), 2: m(2, ["b"], "2026-11-22T09:00:00Z"), 3: m(3, ["c"])}, 1,
    ...               dt.datetime(2026, 11, 22, tzinfo=dt.UTC))
    ([1], ['a'])
    """
    versions = sorted(manifests)
    old = versions[:-keep] if keep < len(versions) else []
    dropped = [v for v in old if keep_after is None or _published(manifests[v]) < keep_after]
    kept_files = {f for v in versions if v not in dropped for f in manifests[v]["files"]}
    garbage = sorted({f for v in dropped for f in manifests[v]["files"]} - kept_files)
    return dropped, garbage


def _published(manifest: Manifest) -> dt.datetime:
    """When a version was published (a manifest without the time counts as long ago)."""
    text = manifest.get("published_at")
    if not text:
        return dt.datetime.min.replace(tzinfo=dt.UTC)
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def apply_retention(
    tdir: str,
    keep: int,
    expire: Callable[[list[int]], set[str]] = lambda dropped: set(),
    keep_hours: float = 0.0,
    now: dt.datetime | None = None,
    guard: Callable[[], None] = lambda: None,
    current: Manifest | None = None,
    known: Sequence[Manifest] = (),
) -> list[int]:
    """Keep the newest ``keep`` versions (the current one always) and every version published
    less than ``keep_hours`` before ``now``; returns the dropped versions.

    ``guard`` (the fence check) runs before anything is expired or deleted. ``expire`` is
    then called, when there is anything to delete, with the versions about to be dropped (maybe
    none) and returns files still needed elsewhere (those the kept Iceberg snapshots list):
    never deleted. ``current``: the current manifest, as its writer just switched to it (None:
    read here); neither it nor its version's file is read again. ``known``: manifests of older
    versions as their files hold them (read by the caller, who holds the pipeline's lock: the
    file of a version that is no longer current is never written again), not read again."""
    if current is None:
        current = find_manifest(tdir)
    given = {m["version"]: m for m in known}
    manifests = {
        v: given[v] if v in given else load_manifest(version_uri(tdir, v))
        for v in version_numbers(tdir)
        if current is None or v != current["version"]
    }
    if current is not None:
        manifests[current["version"]] = current
        manifests = {v: m for v, m in manifests.items() if v <= current["version"]}
    keep_after = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(hours=keep_hours)
    dropped, garbage = files_to_drop(manifests, max(1, keep), keep_after)
    if current is not None:
        listed = {f for v, m in manifests.items() if v not in dropped for f in m["files"]}
        garbage += _leftovers(tdir, current["version"], listed | set(garbage))
    guard()
    # Only data files may be listed by a kept Iceberg snapshot: garbage that is only pending
    # manifests (of a release before, which left one at every version) needs no look at the
    # snapshots.
    data_garbage = any(f.startswith(f"{DATA_DIR}/") for f in garbage)
    needed = expire(dropped) if dropped or data_garbage else set()
    garbage = [f for f in garbage if f not in needed]
    for relative in garbage:
        storage.delete_file(storage.join(tdir, relative))
    for version in dropped:
        storage.delete_file(version_uri(tdir, version))
    if (
        dropped or garbage
    ):  # a pending manifest alone (a release before left one a version) is routine
        log.log(
            logging.INFO if dropped or data_garbage else logging.DEBUG,
            "%s: retention dropped version(s) %s and %d file(s)",
            tdir,
            ", ".join(map(str, dropped)) or "none",
            len(garbage),
        )
    return dropped


def _leftovers(tdir: str, current: int, listed: set[str]) -> list[str]:
    """Files (relative to ``tdir``) that publish attempts of versions up to ``current`` left and
    nothing lists: data files never committed, pending manifests of switched versions."""
    out = []
    for uri in storage.list_files(storage.join(tdir, DATA_DIR)):
        relative = f"{DATA_DIR}/{storage.basename(uri)}"
        version = file_version(storage.basename(uri))
        if version is not None and version <= current and relative not in listed:
            out.append(relative)
    for uri in storage.list_files(storage.join(tdir, META_DIR, "pending"), suffix=".json"):
        match = _PENDING_FILE.match(storage.basename(uri))
        if match and int(match.group(1)) <= current:
            out.append(f"{META_DIR}/pending/{storage.basename(uri)}")
    return sorted(out)
