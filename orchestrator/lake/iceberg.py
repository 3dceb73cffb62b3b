"""Every published table is an Apache Iceberg table: one snapshot per published version.

docs/output.md, "Iceberg". The data files `VersionWriter`
writes are registered as they are (never rewritten): the first version appends
them, a later one replaces exactly the files it rewrote, in one atomic snapshot
whose summary carries ``tidemark.run-id``, ``tidemark.version`` and
``tidemark.position`` (`orchestrator.lake.iceberg_commit`). A rerun finds the snapshot
of its run and does not commit twice. Field IDs are the Iceberg schema's: `prepare_table`
prepares the table's schema update (`Evolving`, committed with the version's snapshot) or the
creation of a new table (`iceberg_create`), and gives the Arrow schema the files are written
with, ``PARQUET:field_id`` on every field, before any file is written; a column whose type
Iceberg cannot promote is replaced by a new field of the same name (`_schema_update`).
Retention expires the snapshots of dropped versions and deletes the manifest files only they
used.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, ResolveError
from pyiceberg.io import PY_IO_IMPL
from pyiceberg.io.pyarrow import pyarrow_to_schema
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema, promote
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.types import BinaryType, IcebergType, StringType

from orchestrator.config import PipelineConfig, objectstore
from orchestrator.errors import RunFailed, resnapshot_hint
from orchestrator.lake import storage
from orchestrator.lake.iceberg_avro import remember_avro_schemas
from orchestrator.lake.iceberg_catalog import parsing_once
from orchestrator.lake.iceberg_create import NewTable
from orchestrator.lake.iceberg_io import DURABLE_FILE_IO
from orchestrator.lake.iceberg_owner import check_owned, owns
from orchestrator.lake.manifest import DOC, published_schema
from orchestrator.lake.writer import with_field_ids
from orchestrator.schema.tables import TableInfo
from orchestrator.state.schema import SQLITE_BUSY_TIMEOUT_MS

remember_avro_schemas()  # every manifest this process reads (`iceberg_avro`)

log = logging.getLogger(__name__)
_OPENING = threading.Lock()
#: The namespaces each open catalog has created or found (`_ensure_namespace`).
_NAMESPACES: weakref.WeakKeyDictionary[Catalog, set[str]] = weakref.WeakKeyDictionary()

RUN_ID, VERSION, POSITION = "tidemark.run-id", "tidemark.version", "tidemark.position"
#: The publish attempt that wrote the snapshot's new files (`storage.attempt_tag`).
ATTEMPT = "tidemark.attempt"
#: A commit that lost the catalog's compare-and-swap fails: pyiceberg would otherwise (4 times by
#: default) rebuild it on the newer table and commit it there, a stale writer's version landing on
#: top of its successor's (`iceberg_commit.commit_version`).
NO_COMMIT_RETRIES = {TableProperties.COMMIT_NUM_RETRIES: "0"}
#: Table properties set at creation: old metadata files are deleted as new ones are written; no
#: commit retried on a newer table.
_TABLE_PROPERTIES = {
    TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
    TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "10",
    **NO_COMMIT_RETRIES,
}


def catalog_properties(config: PipelineConfig) -> dict[str, str]:
    """``output.catalog``'s pyiceberg properties. A SQL catalog (``type: sql``, or neither
    ``type`` nor ``uri`` given: the default) without a ``uri`` is kept in ``state.url``'s database
    (on PostgreSQL its tables are those of Iceberg's JDBC catalog); a ``uri`` without a ``type``
    is left for pyiceberg to infer (``http(s)://``: a REST catalog). A SQLite database waits for
    another writer as long as the state store does (`SQLITE_BUSY_TIMEOUT_MS`; pyiceberg's engine
    gave up after sqlite3's 5 s, while a run's publish workers, its heartbeat and its
    checkpoints all write there). A local or S3 lake's Iceberg files are written by
    `iceberg_io.DurableFileIO` (on disk before a commit names them; on S3 one request a file)
    unless the properties name a ``py-io-impl`` or the catalog is REST (its server writes the
    metadata files, and may name the FileIO the client uses). A lake on an object store gets
    ``output.s3``'s endpoint, region, addressing and credentials as FileIO properties
    (`objectstore.iceberg_properties`).

    >>> from types import SimpleNamespace as NS
    >>> def cfg(path="hdfs://nn/lake", **props):
    ...     return NS(output=NS(path=path, catalog=NS(properties=props)), state=NS(url="sqlite:///s.db"))
    >>> catalog_properties(cfg())
    {'type': 'sql', 'uri': 'sqlite:///s.db?timeout=30'}
    >>> catalog_properties(cfg(warehouse="/lake"))
    {'warehouse': '/lake', 'type': 'sql', 'uri': 'sqlite:///s.db?timeout=30'}
    >>> catalog_properties(cfg(uri="http://rest:8181"))
    {'uri': 'http://rest:8181'}
    >>> catalog_properties(cfg("/lake"))["py-io-impl"]
    'orchestrator.lake.iceberg_io.DurableFileIO'
    >>> from orchestrator.config import S3Config
    >>> def s3cfg(**s3):
    ...     return NS(output=NS(path="s3://lake", catalog=NS(properties={}), s3=S3Config(**s3)),
    ...               state=NS(url="sqlite:///s.db"))
    >>> props = catalog_properties(s3cfg(endpoint="http://127.0.0.1:9000", path_style=True))
    >>> props["s3.endpoint"], props["s3.region"], props["s3.force-virtual-addressing"]
    ('http://127.0.0.1:9000', 'us-east-1', 'false')
    >>> props["py-io-impl"]
    'orchestrator.lake.iceberg_io.DurableFileIO'
    """
    properties = dict(config.output.catalog.properties)
    rest = properties.get("type") == "rest" or str(properties.get("uri", "")).startswith(
        ("http:", "https:")
    )
    if (storage.is_local(config.output.path) or objectstore.is_s3(config.output.path)) and not rest:
        properties.setdefault(PY_IO_IMPL, DURABLE_FILE_IO)
    if objectstore.is_s3(config.output.path):
        s3 = config.output.s3
        for key, value in objectstore.iceberg_properties(s3, objectstore.credentials(s3)).items():
            properties.setdefault(key, value)
    if properties.get("type", "sql" if "uri" not in properties else None) == "sql":
        properties.setdefault("type", "sql")
        properties.setdefault("uri", config.state.url)
        uri = properties["uri"]
        if uri.startswith("sqlite:") and "?" not in uri:
            properties["uri"] = f"{uri}?timeout={SQLITE_BUSY_TIMEOUT_MS // 1000}"
    return properties


#: The engines of the SQL catalogs this process opened (`open_catalog`), for `close_catalogs`.
_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()


def open_catalog(config: PipelineConfig) -> Catalog:
    """The configured catalog (open it once per publish: an in-memory one lives as long as it).

    Read tasks open it too, several at once: a SQL catalog creates its tables when first
    opened, and one opening may find them created by another between its check and its
    CREATE; the second try finds them there."""
    name = config.output.catalog.name
    try:
        with _OPENING:
            try:
                catalog = parsing_once(load_catalog(name, **catalog_properties(config)))
            except Exception as exc:
                if "already exists" not in str(exc):
                    raise
                catalog = parsing_once(load_catalog(name, **catalog_properties(config)))
            if (engine := getattr(catalog, "engine", None)) is not None:
                _ENGINES.add(engine)
            return catalog
    except Exception as exc:  # pyiceberg raises ValueError, ImportError, driver errors...
        raise RunFailed(
            f"cannot open the Iceberg catalog `{name}` (output.catalog): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; "
            "check output.catalog's type and uri"
        ) from exc


def close_catalogs() -> None:
    """Close the connections of the SQL catalogs this process opened; called at a run's end.

    A catalog's engine keeps its connection until the catalog is collected, and a closed SQLite
    connection's file stays open while another connection of the process (the state store's)
    holds its lock: a process that runs again and again (`run --every`) kept one more open file
    per run that published (docs/limits.md). A closed engine opens a new connection when it is
    used again."""
    for engine in list(_ENGINES):
        engine.dispose()


def table_uri(tdir: str) -> str:
    """A table dir as the full URI Iceberg records (local paths become ``file://``).

    >>> table_uri("/lake/shop/orders"), table_uri("s3://lake/shop/orders")
    ('file:///lake/shop/orders', 's3://lake/shop/orders')
    """
    return "file://" + storage.local_path(tdir) if storage.is_local(tdir) else tdir


@dataclass(frozen=True, slots=True)
class Evolving:
    """A table whose columns the version's commit changes: `stage` puts the schema update in
    that commit's transaction, so no catalog reader ever sees the new schema over the old
    snapshot's files (a replaced column read as NULL), nor a crash leaves it so."""

    table: Table
    name: str
    wanted: pa.Schema | None  # the Iceberg schema to evolve to (`_wanted`); None: no column changes
    order: (
        tuple[str, ...] | None
    )  # the source's column order, when the columns must be moved into it

    def stage(self, tx: Transaction) -> None:
        """The schema update staged in ``tx``, the transaction of the version's snapshot."""
        if self.wanted is not None:
            replaced = _unpromotable(self.table, self.wanted)
            update = _schema_update(self.table, self.name, self.wanted, tx)
            try:
                update.commit()  # into the transaction
            except ValueError as exc:
                raise _cannot_evolve(self.name, exc) from exc
            if replaced:
                log.warning(
                    "table %s: column(s) %s changed to a type Iceberg cannot promote: replaced by "
                    "new column(s) of the same name with new field IDs (older snapshots and "
                    "readers of an older metadata_location keep the old columns)",
                    self.name,
                    ", ".join(replaced),
                )
            log.info(
                "table %s: the version's commit evolves the Iceberg schema to %s",
                self.name,
                ", ".join(self.wanted.names),
            )
        if self.order is not None:
            _reorder(tx, self.name, self.order)


#: What `prepare_table` hands `commit_version`: the table as loaded, the table with the schema
#: update its commit stages, or, for a table the catalog does not have yet, what
#: `iceberg_create.create_all` creates it from with its first snapshot.
Prepared = Table | Evolving | NewTable


def load(catalog: Catalog, table: str) -> Table | None:
    """The Iceberg table, or None when the catalog has none of that name (publish loads it once:
    `find_run`, `prepare_table` and `commit_version` all take what it loaded)."""
    try:
        return catalog.load_table(table)
    except NoSuchTableError:
        return None


def prepare_table(
    catalog: Catalog, table: str, tdir: str, schema: pa.Schema, loaded: Table | None
) -> tuple[pa.Schema, Prepared]:
    """Stage the Iceberg table's creation, or the evolution of its schema to ``schema`` (new
    columns get new field IDs, existing IDs never change, widenings Iceberg allows evolve in
    place); returns ``schema`` with the field IDs the table will have (the schema the version's
    files are written with) and what `commit_version` commits on. Nothing is committed here:
    a changed schema is committed with the version's snapshot, in one commit (`Evolving`).

    A new table is not created here either: `iceberg_create.create_all` creates it with its
    first snapshot, one metadata file and one catalog commit (creating it first took a second
    of each, and two loads more). ``loaded``: the table as `load` found it."""
    if loaded is None:
        _ensure_namespace(catalog, table.split(".", 1)[0])
        first = _first_schema(schema)
        return first, NewTable(
            table, table_uri(tdir), iceberg_schema(first, schema), _TABLE_PROPERTIES
        )
    check_owned(loaded, table, tdir)
    wanted = _wanted(loaded, schema)
    fields = loaded.schema().fields
    if wanted is not None:
        try:  # the update `Evolving.stage` puts in the commit, applied to a copy of the metadata
            fields = _schema_update(loaded, table, wanted)._apply().fields
        except ValueError as exc:
            raise _cannot_evolve(table, exc) from exc
    order = tuple(schema.names) if [f.name for f in fields] != schema.names else None
    ids = with_field_ids(schema, {f.name: f.field_id for f in fields})
    if wanted is None and order is None:
        return ids, loaded
    return ids, Evolving(loaded, table, wanted, order)


def _ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless this catalog object already did or found it (once per publish,
    which opens the catalog once, not once per table: three statements and a commit each)."""
    known = _NAMESPACES.setdefault(catalog, set())
    if namespace in known:
        return
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:  # the SQL catalog's insert lost a race with another process (IntegrityError)
        if not catalog.namespace_exists(namespace):
            raise
    known.add(namespace)


def planned_schema(
    catalog: Catalog, table: str, schema: pa.Schema, *, exists: bool = True
) -> pa.Schema:
    """What `prepare_table` will return for ``schema``, without changing the catalog: the schema
    data files written before publish (a snapshot's chunk files, rewritten files) carry. Publish
    checks each file's field IDs against `prepare_table`'s and rewrites a file that differs.
    ``exists``: False when the caller knows the catalog has no such table (nothing to load)."""
    if not exists:
        return _first_schema(schema)
    try:
        iceberg = catalog.load_table(table)
    except NoSuchTableError:
        return _first_schema(schema)
    wanted = _wanted(iceberg, schema)
    fields = iceberg.schema().fields
    if wanted is not None:
        try:  # the same update the version's commit stages (`Evolving`), applied to a copy of
            # the metadata
            fields = _schema_update(iceberg, table, wanted)._apply().fields
        except Exception as exc:
            log.info(
                "table %s: cannot foresee the Iceberg field IDs (%s); publish will check them",
                table,
                exc,
            )
    ids = {f.name: f.field_id for f in fields}
    return with_field_ids(schema, {name: ids.get(name, 0) for name in schema.names})


def data_file_schema(
    config: PipelineConfig, table: TableInfo, catalog: Catalog | None = None
) -> pa.Schema:
    """The schema a table's new data files are written with before publish: published types,
    the field IDs publish will commit (`planned_schema`). ``catalog``: one already open (a step
    of many tables opens it once)."""
    return planned_schema(
        catalog or open_catalog(config), table.name, published_schema(table.columns)
    )


def data_file_schemas(
    config: PipelineConfig, tables: Iterable[TableInfo], catalog: Catalog
) -> dict[str, pa.Schema]:
    """`data_file_schema` of many tables, by name: the catalog lists each database's tables once,
    and only the tables it has are loaded (a first run of thousands of small tables loads none)."""
    listed: dict[str, set[str]] = {}
    out = {}
    for table in tables:
        namespace = table.database
        if namespace not in listed:
            try:
                listed[namespace] = {".".join(ident) for ident in catalog.list_tables(namespace)}
            except NoSuchNamespaceError:
                listed[namespace] = set()
        out[table.name] = planned_schema(
            catalog,
            table.name,
            published_schema(table.columns),
            exists=table.name in listed[namespace],
        )
    return out


def iceberg_schema(with_ids: pa.Schema, published: pa.Schema) -> Schema:
    """The Iceberg schema of a data file schema (``with_ids``), each field with the doc its
    published field carries (a spatial column's SRID, docs/types.md): the data files hold the
    field IDs alone, the Iceberg schema the docs too.

    >>> docs = pa.schema([pa.field("g", pa.binary(), metadata={DOC: "OGC WKB, SRID 4326"})])
    >>> iceberg_schema(with_field_ids(docs, {"g": 1}), docs).fields[0].doc
    'OGC WKB, SRID 4326'
    """
    docs = {f.name: f.metadata[DOC] for f in published if f.metadata and DOC in f.metadata}
    return pyarrow_to_schema(
        pa.schema(
            f.with_metadata({**(f.metadata or {}), DOC: docs[f.name]}) if f.name in docs else f
            for f in with_ids
        )
    )


def _first_schema(schema: pa.Schema) -> pa.Schema:
    """The field IDs of a new table: 1, 2, ... in column order (as Iceberg assigns them)."""
    return with_field_ids(schema, {f.name: i for i, f in enumerate(schema, start=1)})


def _wanted(iceberg: Table, schema: pa.Schema) -> pa.Schema | None:
    """The Iceberg schema ``schema`` evolves the table to, or None when it needs no change.

    Iceberg adds a column only as optional, and never tightens one: a column the table has as
    optional, or does not have yet, is wanted optional (the files may still hold it required)."""
    ids = {f.name: f.field_id for f in iceberg.schema().fields}
    optional = {f.name for f in iceberg.schema().fields if not f.required}
    wanted = pa.schema(
        f.with_nullable(True) if f.name in optional or f.name not in ids else f for f in schema
    )
    if set(ids) != set(
        schema.names
    ) or (  # in any order: a replaced column comes last (_schema_update)
        set(iceberg_schema(with_field_ids(wanted, ids), schema).fields)
        != set(iceberg.schema().fields)
    ):
        return wanted
    return None


def _schema_update(
    iceberg: Table, table: str, schema: pa.Schema, tx: Transaction | None = None
) -> UpdateSchema:
    """The uncommitted schema update of ``iceberg`` to ``schema``, in ``tx`` (None: a transaction
    of its own). A column whose type Iceberg cannot promote (INT -> VARCHAR, BIGINT -> INT,
    VARCHAR <-> VARBINARY, a DECIMAL scale change...) is replaced: the old field is dropped and a
    new one of the same name added with a new field ID (put back in the source's place by
    `_reorder`: pyiceberg cannot move a column added in the same update). Only a snapshot (every
    file written anew) publishes a changed column type, so the new snapshot's files all carry
    the new ID, and older snapshots keep reading their files with their own schema."""
    replaced = _unpromotable(iceberg, schema)
    update = (tx or iceberg).update_schema(allow_incompatible_changes=False)
    try:
        for name in replaced:
            update.delete_column(name)
        for name in replaced:
            field = iceberg_schema(
                with_field_ids(pa.schema([schema.field(name)]), {name: 1}), schema
            ).fields[0]
            update.add_column(name, field.field_type, doc=field.doc)
        update.union_by_name(pa.schema(f for f in schema if f.name not in replaced))
        for name in {f.name for f in iceberg.schema().fields} - set(schema.names):
            update.delete_column(name)
    except ValueError as exc:
        raise _cannot_evolve(table, exc) from exc
    return update


def _cannot_evolve(table: str, exc: ValueError) -> RunFailed:
    return RunFailed(
        f"table {table}: the source's columns changed in a way Iceberg cannot evolve ({exc}); "
        f"drop the Iceberg table {table} from output.catalog and " + resnapshot_hint(table)
    )


def _reorder(tx: Transaction, table: str, names: Sequence[str]) -> None:
    """The Iceberg columns put in the source's order (``names``, the same set), an update of their
    own in ``tx`` after `_schema_update`'s: a column added or replaced there comes last (pyiceberg
    moves only a column the schema had before the update), and the source can move a column
    (``ADD ... FIRST``, ``MODIFY ... AFTER``). Readers match columns by field ID: files keep
    theirs."""
    with tx.update_schema() as update:
        update.move_first(names[0])
        for before, name in pairwise(names):
            update.move_after(name, before)
    log.info("table %s: Iceberg columns put in the source's order: %s", table, ", ".join(names))


def _unpromotable(iceberg: Table, schema: pa.Schema) -> list[str]:
    """The columns of both schemas whose Iceberg type changes in a way Iceberg does not allow."""
    current = {f.name: f.field_type for f in iceberg.schema().fields}
    common = [f for f in schema if f.name in current]
    wanted = pyarrow_to_schema(
        with_field_ids(pa.schema(common), {f.name: i for i, f in enumerate(common, 1)})
    )
    return [
        f.name
        for f in wanted.fields
        if f.field_type != current[f.name] and not _promotable(current[f.name], f.field_type)
    ]


def _promotable(old: IcebergType, new: IcebergType) -> bool:
    """Whether Iceberg evolves a column of type ``old`` to ``new`` in place. pyiceberg's `promote`
    (a reader's rule for Avro files) also accepts string <-> binary, which a schema update does
    not carry out: the field kept its old type and the new files' bounds failed the commit.

    >>> from pyiceberg.types import BinaryType, IntegerType, LongType, StringType
    >>> _promotable(IntegerType(), LongType()), _promotable(StringType(), BinaryType())
    (True, False)
    >>> _promotable(BinaryType(), StringType())
    False
    """
    if {type(old), type(new)} == {StringType, BinaryType}:
        return False
    try:
        promote(old, new)
    except ResolveError:
        return False
    return True


def drop_table(config: PipelineConfig, table: str, tdir: str) -> bool:
    """Remove ``table`` from the catalog when it is the table at ``tdir`` (its files are the
    caller's); False when it was not there, or is at another location: another pipeline's
    (`iceberg_owner`), left alone with a WARNING."""
    catalog = open_catalog(config)
    loaded = load(catalog, table)
    if loaded is None:
        return False
    if not owns(loaded, tdir):
        log.warning(
            "Iceberg table %s is at %s, not %s: another pipeline's; left in the catalog",
            table,
            loaded.location(),
            tdir,
        )
        return False
    catalog.drop_table(table)
    return True


def data_files(iceberg: Table, snapshot_id: int | None = None) -> Iterable[DataFile]:
    snapshot = (
        iceberg.snapshot_by_id(snapshot_id)
        if snapshot_id is not None
        else iceberg.current_snapshot()
    )
    if snapshot is None:
        return []
    return [
        entry.data_file
        for manifest in snapshot.manifests(iceberg.io)
        for entry in manifest.fetch_manifest_entry(iceberg.io, discard_deleted=True)
    ]


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


def expire_versions(
    catalog: Catalog, table: str, tdir: str, versions: Sequence[int]
) -> tuple[set[str], str | None]:
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
    # the current snapshot, and any a tag or branch names (a user's, for time travel), stay
    kept = {ref.snapshot_id for ref in iceberg.metadata.refs.values()}
    current = iceberg.current_snapshot()
    if current is not None:
        kept.add(current.snapshot_id)
    dropped = {str(v) for v in versions}
    expire = [
        s.snapshot_id
        for s in iceberg.snapshots()
        if s.summary is not None and s.summary.get(VERSION) in dropped and s.snapshot_id not in kept
    ]
    if expire:
        candidates = _snapshot_metadata(iceberg, expire)
        iceberg.maintenance.expire_snapshots().by_ids(expire).commit()
        iceberg = iceberg.refresh()
        unused = candidates - _snapshot_metadata(
            iceberg, [s.snapshot_id for s in iceberg.snapshots()]
        )
        for path in sorted(unused):
            iceberg.io.delete(path)
        log.info(
            "table %s: expired Iceberg snapshot(s) %s, deleted %d manifest file(s) "
            "no kept snapshot lists",
            table,
            ", ".join(map(str, expire)),
            len(unused),
        )
    prefix = table_uri(tdir).rstrip("/") + "/"
    needed = {
        f.file_path[len(prefix) :]
        for s in iceberg.snapshots()
        for f in data_files(iceberg, s.snapshot_id)
        if f.file_path.startswith(prefix)
    }
    return needed, iceberg.metadata_location
