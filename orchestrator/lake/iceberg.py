"""Every published table is an Apache Iceberg table: one snapshot per published version.

CONTRACT.md "Every table is an Apache Iceberg table". The data files `VersionWriter`
writes are registered as they are (never rewritten): the first version appends
them, a later one replaces exactly the files it rewrote, in one atomic snapshot
whose summary carries ``tidemark.run-id``, ``tidemark.version`` and
``tidemark.position``. A rerun finds the snapshot of its run and does not commit
twice. Field IDs are the Iceberg schema's: `prepare` creates or evolves the table
and gives the Arrow schema the files are written with, ``PARQUET:field_id`` on
every field, before any file is written; a column whose type Iceberg cannot promote
is replaced by a new field of the same name (`_evolve`). Retention expires the
snapshots of dropped versions and deletes the manifest files only they used.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError, ResolveError
from pyiceberg.io.pyarrow import parquet_file_to_data_file, pyarrow_to_schema
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.schema import promote
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.snapshot import UpdateSnapshot, _OverwriteFiles

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, resnapshot_hint
from orchestrator.lake import storage
from orchestrator.lake.manifest import IcebergEntry, published_schema
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo

log = logging.getLogger(__name__)
_OPENING = threading.Lock()

FIELD_ID = b"PARQUET:field_id"
RUN_ID, VERSION, POSITION = "tidemark.run-id", "tidemark.version", "tidemark.position"
#: The publish attempt that wrote the snapshot's new files (`storage.attempt_tag`).
ATTEMPT = "tidemark.attempt"
#: Table properties set at creation: old metadata files are deleted as new ones are written.
_TABLE_PROPERTIES = {TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
                     TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "10"}


def catalog_properties(config: PipelineConfig) -> dict[str, str]:
    """``output.catalog``'s pyiceberg properties; by default a SQL catalog in ``state.url``'s
    database (on PostgreSQL its tables are those of Iceberg's JDBC catalog)."""
    return dict(config.output.catalog.properties) or {"type": "sql", "uri": config.state.url}


def open_catalog(config: PipelineConfig) -> Catalog:
    """The configured catalog (open it once per publish: an in-memory one lives as long as it).

    Read tasks open it too, several at once: a SQL catalog creates its tables when first
    opened, and one opening may find them created by another between its check and its
    CREATE; the second try finds them there."""
    name = config.output.catalog.name
    try:
        with _OPENING:
            try:
                return load_catalog(name, **catalog_properties(config))
            except Exception as exc:
                if "already exists" not in str(exc):
                    raise
                return load_catalog(name, **catalog_properties(config))
    except Exception as exc:  # pyiceberg raises ValueError, ImportError, driver errors...
        raise RunFailed(f"cannot open the Iceberg catalog `{name}` (output.catalog): "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
                        "check output.catalog's type and uri") from exc


def table_uri(tdir: str) -> str:
    """A table dir as the full URI Iceberg records (local paths become ``file://``).

    >>> table_uri("/lake/shop/orders"), table_uri("s3://lake/shop/orders")
    ('file:///lake/shop/orders', 's3://lake/shop/orders')
    """
    return "file://" + storage.local_path(tdir) if storage.is_local(tdir) else tdir


def with_field_ids(schema: pa.Schema, ids: dict[str, int]) -> pa.Schema:
    """``schema`` with each field's Iceberg field ID as its one metadata entry, ``PARQUET:field_id``
    (the data files' schema: Spark's writer, which writes the chunk files, keeps no other field
    metadata, so neither do pyarrow's files; the manifest's ``columns`` name the MySQL types)."""
    return pa.schema(f.with_metadata({FIELD_ID: str(ids[f.name]).encode()}) for f in schema)


def prepare(catalog: Catalog, table: str, tdir: str, schema: pa.Schema) -> pa.Schema:
    """Create the Iceberg table, or evolve its schema to ``schema`` (new columns get new field
    IDs, existing IDs never change, widenings Iceberg allows evolve in place); returns ``schema``
    with the table's field IDs, the schema the version's files are written with."""
    return prepare_table(catalog, table, tdir, schema)[0]


def prepare_table(catalog: Catalog, table: str, tdir: str, schema: pa.Schema) -> tuple[pa.Schema, Table]:
    """`prepare`, and the Iceberg table as loaded (hand it to `commit_version`: no second load)."""
    namespace = table.split(".", 1)[0]
    try:
        iceberg = catalog.load_table(table)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(namespace)
        iceberg = catalog.create_table(table, schema=pyarrow_to_schema(_first_schema(schema)),
                                       location=table_uri(tdir), properties=_TABLE_PROPERTIES)
        log.info("table %s: created Iceberg table %s at %s", table, table, table_uri(tdir))
    wanted = _wanted(iceberg, schema)
    if wanted is not None:
        iceberg = _evolve(iceberg, table, wanted)
    return with_field_ids(schema, {f.name: f.field_id for f in iceberg.schema().fields}), iceberg


def planned_schema(catalog: Catalog, table: str, schema: pa.Schema) -> pa.Schema:
    """What `prepare` will return for ``schema``, without changing the catalog: the schema data
    files written before publish (a snapshot's chunk files, rewritten files) carry. Publish
    checks each file's field IDs against `prepare`'s and rewrites a file that differs."""
    try:
        iceberg = catalog.load_table(table)
    except NoSuchTableError:
        return _first_schema(schema)
    wanted = _wanted(iceberg, schema)
    fields = iceberg.schema().fields
    if wanted is not None:
        try:  # the same update `prepare` commits, applied to a copy of the metadata only
            fields = _schema_update(iceberg, table, wanted)._apply().fields
        except Exception as exc:
            log.info("table %s: cannot foresee the Iceberg field IDs (%s); publish will check them", table, exc)
    ids = {f.name: f.field_id for f in fields}
    return with_field_ids(schema, {name: ids.get(name, 0) for name in schema.names})


def data_file_schema(config: PipelineConfig, table: TableInfo, catalog: Catalog | None = None) -> pa.Schema:
    """The schema a table's new data files are written with before publish: published types,
    the field IDs publish will commit (`planned_schema`). ``catalog``: one already open (a step
    of many tables opens it once)."""
    return planned_schema(catalog or open_catalog(config), table.name, published_schema(table.columns))


def _first_schema(schema: pa.Schema) -> pa.Schema:
    """The field IDs of a new table: 1, 2, ... in column order (as Iceberg assigns them)."""
    return with_field_ids(schema, {f.name: i for i, f in enumerate(schema, start=1)})


def _wanted(iceberg: Table, schema: pa.Schema) -> pa.Schema | None:
    """The Iceberg schema ``schema`` evolves the table to, or None when it needs no change.

    Iceberg adds a column only as optional, and never tightens one: a column the table has as
    optional, or does not have yet, is wanted optional (the files may still hold it required)."""
    ids = {f.name: f.field_id for f in iceberg.schema().fields}
    optional = {f.name for f in iceberg.schema().fields if not f.required}
    wanted = pa.schema(f.with_nullable(True) if f.name in optional or f.name not in ids else f
                       for f in schema)
    if set(ids) != set(schema.names) or (  # in any order: a replaced column comes last (_evolve)
            set(pyarrow_to_schema(with_field_ids(wanted, ids)).fields) != set(iceberg.schema().fields)):
        return wanted
    return None


def _schema_update(iceberg: Table, table: str, schema: pa.Schema) -> UpdateSchema:
    """The uncommitted schema update to ``schema`` (see `_evolve`)."""
    replaced = _unpromotable(iceberg, schema)
    update = iceberg.update_schema(allow_incompatible_changes=False)
    try:
        for name in replaced:
            update.delete_column(name)
        for name in replaced:
            field = pyarrow_to_schema(with_field_ids(pa.schema([schema.field(name)]), {name: 1})).fields[0]
            update.add_column(name, field.field_type, doc=field.doc)
        update.union_by_name(pa.schema(f for f in schema if f.name not in replaced))
        for name in {f.name for f in iceberg.schema().fields} - set(schema.names):
            update.delete_column(name)
    except ValueError as exc:
        raise _cannot_evolve(table, exc) from exc
    return update


def _cannot_evolve(table: str, exc: ValueError) -> RunFailed:
    return RunFailed(f"table {table}: the source's columns changed in a way Iceberg cannot evolve ({exc}); "
                     f"drop the Iceberg table {table} from output.catalog and " + resnapshot_hint(table))


def _evolve(iceberg: Table, table: str, schema: pa.Schema) -> Table:
    """Evolve the table's schema to ``schema`` in one commit. A column whose type Iceberg cannot
    promote (INT -> VARCHAR, BIGINT -> INT, a DECIMAL scale change...) is replaced: the old
    field is dropped and a new one of the same name added with a new field ID (last in the Iceberg
    schema: pyiceberg cannot move a column added in the same commit). Only a snapshot
    (every file written anew) publishes a changed column type, so the new snapshot's files all
    carry the new ID, and older snapshots keep reading their files with their own schema."""
    replaced = _unpromotable(iceberg, schema)
    update = _schema_update(iceberg, table, schema)
    try:
        update.commit()
    except ValueError as exc:
        raise _cannot_evolve(table, exc) from exc
    if replaced:
        log.warning("table %s: column(s) %s changed to a type Iceberg cannot promote: replaced by new "
                    "column(s) of the same name with new field IDs (older snapshots and readers of an "
                    "older metadata_location keep the old columns)", table, ", ".join(replaced))
    log.info("table %s: evolved the Iceberg schema to %s", table, ", ".join(schema.names))
    return iceberg.refresh()


def _unpromotable(iceberg: Table, schema: pa.Schema) -> list[str]:
    """The columns of both schemas whose Iceberg type changes in a way Iceberg does not allow."""
    current = {f.name: f.field_type for f in iceberg.schema().fields}
    common = [f for f in schema if f.name in current]
    wanted = pyarrow_to_schema(with_field_ids(pa.schema(common), {f.name: i for i, f in enumerate(common, 1)}))
    out = []
    for field in wanted.fields:
        if field.field_type == current[field.name]:
            continue
        try:
            promote(current[field.name], field.field_type)
        except ResolveError:
            out.append(field.name)
    return out


def drop_table(config: PipelineConfig, table: str) -> bool:
    """Remove ``table`` from the catalog (its files are the caller's); False when it was not there."""
    try:
        open_catalog(config).drop_table(table)
    except NoSuchTableError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class RunCommit:
    """The snapshot a run committed: which version, written by which publish attempt."""

    entry: IcebergEntry
    version: int | None
    attempt: str | None  # None: committed before attempts were recorded

    def __str__(self) -> str:
        return (f"Iceberg snapshot {self.entry['snapshot_id']} of version {self.version} "
                f"(publish attempt {self.attempt or 'unrecorded'})")


def find_run(catalog: Catalog, table: str, run_id: str) -> RunCommit | None:
    """The snapshot a run committed for ``table``, if it did (the rerun of a crashed publish)."""
    try:
        iceberg = catalog.load_table(table)
    except NoSuchTableError:
        return None
    for snapshot in iceberg.snapshots():
        if snapshot.summary is not None and snapshot.summary.get(RUN_ID) == run_id:
            version = snapshot.summary.get(VERSION)
            return RunCommit(_entry(catalog, table, iceberg, snapshot.snapshot_id),
                             int(version) if version else None, snapshot.summary.get(ATTEMPT))
    return None


def commit_version(catalog: Catalog, table: str, tdir: str, files: Sequence[str], *, version: int,
                   run_id: str, position: BinlogPosition, attempt: str,
                   guard: Callable[[], None] = lambda: None, loaded: Table | None = None) -> IcebergEntry:
    """Make ``files`` (relative to ``tdir``) the table's current Iceberg snapshot, atomically:
    the files not in the current snapshot are added, those no longer listed are removed.
    Committing the same run again returns its snapshot.

    ``guard`` (the fence check) runs after the table is loaded and before the commit: a
    takeover before the load fails the guard, one after it fails the commit, whose parent
    snapshot the catalog checks (compare-and-swap). A writer that lost the pipeline lock
    cannot commit over its successor's versions. ``loaded``: the table as `prepare_table`
    loaded it, by a caller that found no snapshot of this run (`find_run`): neither is done again."""
    if loaded is None:
        done = find_run(catalog, table, run_id)
        iceberg = catalog.load_table(table)
        guard()
        if done is not None:
            return done.entry
    else:
        iceberg = loaded
        guard()
    listed = {f.file_path: f for f in _data_files(iceberg)}
    wanted = [storage.join(table_uri(tdir), f) for f in files]
    properties = {RUN_ID: run_id, VERSION: str(version), ATTEMPT: attempt,
                  POSITION: json.dumps(position.to_json(), sort_keys=True)}
    with iceberg.transaction() as tx:
        update = tx.update_snapshot(snapshot_properties=properties)
        with (_overwrite(update) if listed else update.fast_append()) as snapshot:
            for path in listed.keys() - set(wanted):
                snapshot.delete_data_file(listed[path])
            for path in wanted:
                if path not in listed:
                    snapshot.append_data_file(parquet_file_to_data_file(iceberg.io, tx.table_metadata, path))
    current = iceberg.current_snapshot()
    assert current is not None, "a commit makes a snapshot"
    log.info("table %s: Iceberg snapshot %d for version %d (%d files added, %d removed)", table,
             current.snapshot_id, version, len(set(wanted) - listed.keys()), len(listed.keys() - set(wanted)))
    return _entry(catalog, table, iceberg, current.snapshot_id)


def _overwrite(update: UpdateSnapshot) -> _OverwriteFiles:
    """pyiceberg's overwrite, carrying into the new snapshot only the earlier manifests that still
    list a live data file.

    pyiceberg (0.12) keeps every manifest of the parent snapshot that none of the deleted files
    is in, including those that list nothing but files an earlier snapshot deleted. Each
    version would then carry one such manifest more than the last: every commit, expiry and
    reader opens them all, and an hourly table would list thousands. Iceberg's spec needs a
    snapshot to list only manifests with live files and the ones it wrote itself (its own
    deletes); its fast append already drops the others, and so does this overwrite.
    """
    producer = update.overwrite()
    carried = producer._existing_manifests

    def live() -> list[ManifestFile]:
        return [m for m in carried() if m.has_added_files() or m.has_existing_files()]

    producer._existing_manifests = live  # type: ignore[method-assign]
    return producer


def _data_files(iceberg: Table, snapshot_id: int | None = None) -> Iterable[DataFile]:
    snapshot = iceberg.snapshot_by_id(snapshot_id) if snapshot_id is not None else iceberg.current_snapshot()
    if snapshot is None:
        return []
    return [entry.data_file for manifest in snapshot.manifests(iceberg.io)
            for entry in manifest.fetch_manifest_entry(iceberg.io, discard_deleted=True)]


def _entry(catalog: Catalog, table: str, iceberg: Table, snapshot_id: int) -> IcebergEntry:
    return IcebergEntry(catalog=catalog.name, identifier=table,
                        metadata_location=iceberg.metadata_location, snapshot_id=snapshot_id)


def _snapshot_metadata(iceberg: Table, snapshot_ids: Iterable[int]) -> set[str]:
    """The manifest lists and manifests (``metadata/*.avro``) of these snapshots.

    Iceberg's expiry removes snapshots from the table metadata but deletes no file; what the
    expired snapshots alone used is deleted by `expire_versions`. (Old ``*.metadata.json`` files
    go by the table properties set at creation, ``_TABLE_PROPERTIES``.)"""
    found: set[str] = set()
    for snapshot_id in snapshot_ids:
        snapshot = iceberg.snapshot_by_id(snapshot_id)
        if snapshot is not None:
            found.add(snapshot.manifest_list)
            found.update(m.manifest_path for m in snapshot.manifests(iceberg.io))
    return found


def expire_versions(catalog: Catalog, table: str, tdir: str, versions: Sequence[int]) -> tuple[set[str], str | None]:
    """Expire the snapshots of the dropped ``versions`` and delete the manifest files only they
    used (Iceberg's expiry deletes no file; data files are retention's, `manifest.apply_retention`).

    Returns:
        The files (relative to ``tdir``) the kept snapshots still list, which retention must
        not delete, and the table's metadata location after the expiry (None: not an Iceberg table).
    """
    try:
        iceberg = catalog.load_table(table)
    except NoSuchTableError:
        return set(), None
    current = iceberg.current_snapshot()
    dropped = {str(v) for v in versions}
    expire = [s.snapshot_id for s in iceberg.snapshots()
              if s.summary is not None and s.summary.get(VERSION) in dropped
              and (current is None or s.snapshot_id != current.snapshot_id)]
    if expire:
        candidates = _snapshot_metadata(iceberg, expire)
        iceberg.maintenance.expire_snapshots().by_ids(expire).commit()
        iceberg = iceberg.refresh()
        unused = candidates - _snapshot_metadata(iceberg, [s.snapshot_id for s in iceberg.snapshots()])
        for path in sorted(unused):
            iceberg.io.delete(path)
        log.info("table %s: expired Iceberg snapshot(s) %s, deleted %d manifest file(s) no kept snapshot lists",
                 table, ", ".join(map(str, expire)), len(unused))
    prefix = table_uri(tdir).rstrip("/") + "/"
    needed = {f.file_path[len(prefix):] for s in iceberg.snapshots() for f in _data_files(iceberg, s.snapshot_id)
              if f.file_path.startswith(prefix)}
    return needed, iceberg.metadata_location
