"""A table new to the catalog, created together with its first snapshot: one metadata file, one
catalog commit, without pyiceberg's transaction machinery.

pyiceberg creates a table with a snapshot through a create transaction: the creation's
updates and the snapshot's applied to the metadata again at every step (each a deep copy of
it), the table looked up again inside the catalog's commit, and the Avro writer of each
manifest and manifest list built anew from its schema by a visitor, with the schema's JSON
for the file's header. For a table of a few hundred rows that was about 11 ms of CPU, most of
a new table's publish (issue 16: a first run of thousands of small tables). Here the same
files are written with pyiceberg's own pieces, once each: `new_table_metadata`, the table's
`DataFile` from each file's footer (`data_file`), pyiceberg's manifest and manifest list
writers (their Avro writers and header JSON built once per process, `_Prebuilt`: the
schemas of an unpartitioned table's manifests do not depend on the table), its snapshot
summary, and the metadata file, which the SQL catalog then registers (`register_all`, the new
tables of a publish group together) by its own INSERT (the same row its own creation inserts)
in one transaction. Another catalog (REST, Glue, Hive) keeps pyiceberg's create transaction
(`_by_transaction`): a REST catalog may hand the client the storage credentials of a table it
stages, and registering a table the client wrote needs a permission staging does not. The
catalog refuses a name it already has (compare-and-swap on "no table of that name"), as
the create transaction's commit did. tests/unit/test_iceberg_create.py holds the metadata,
manifests and summary to what pyiceberg's create transaction writes for the same files.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.file import MAGIC, META_SCHEMA, SYNC_SIZE, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io import FileIO, OutputFile, load_file_io
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestListWriter,
    ManifestListWriterV2,
    ManifestWriterV2,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotLogEntry,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.typedef import TableVersion
from pyiceberg.types import StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.lake.writer import FIELD_ID

FORMAT_VERSION: TableVersion = 2


@dataclass(frozen=True, slots=True)
class NewTable:
    """A table the catalog does not have yet, as `iceberg.prepare_table` stages it: created by
    `create_all` with its first snapshot."""

    identifier: str
    location: str  # the table's URI (``file://...`` for a local lake)
    #: Field IDs 1, 2, ... in column order, as Iceberg assigns them to a new table (the data
    #: files' IDs are checked against the created metadata's: `data_file`).
    schema: Schema
    properties: Mapping[str, str] = field(default_factory=dict)


def _metadata(location: str, schema: Schema, properties: Mapping[str, str]) -> TableMetadata:
    return new_table_metadata(
        schema=schema,
        partition_spec=UNPARTITIONED_PARTITION_SPEC,
        sort_order=UNSORTED_SORT_ORDER,
        location=location.rstrip("/"),
        properties=dict(properties),
    )


@dataclass(frozen=True, slots=True)
class Written:
    """A new table's metadata written (`write`), for the catalog to register (`register_all`)."""

    identifier: str
    metadata_location: str
    snapshot_id: int


#: A table to create: what it is, its data files (full URIs), what its snapshot's summary adds.
Creating = tuple[NewTable, Sequence[str], Mapping[str, str]]


def create_all(
    catalog: Catalog, tables: Sequence[Creating], guard: Callable[[], None] = lambda: None
) -> list[tuple[str, int] | Exception]:
    """Create each of ``tables`` with its first snapshot; for each, its metadata location and
    snapshot ID, or the exception that failed it (the others are created all the same): a name
    the catalog already has fails its table (another writer's; the files written for it are then
    referenced by nothing).

    The SQL catalog: each table's metadata is written (`write`), then all are registered
    together (`register_all`). Another catalog creates each in pyiceberg's create transaction
    (`_by_transaction`): a REST catalog may hand the client the storage credentials of a table
    it stages, and needs no permission to register a table the client wrote. ``guard`` (the
    fence check) runs before the writes and before each commit; what it raises is raised."""
    if not isinstance(catalog, SqlCatalog) or not _REGISTERS_ITSELF:
        out: list[tuple[str, int] | Exception] = []
        for new, paths, summary in tables:
            guard()
            try:
                out.append(_by_transaction(catalog, new, paths, summary))
            except Exception as exc:
                out.append(exc)
        return out
    guard()
    done: list[Written | Exception] = []
    for new, paths, summary in tables:
        try:
            done.append(write(catalog, new, paths, summary))
        except Exception as exc:
            done.append(exc)
    written = [w for w in done if isinstance(w, Written)]
    if written:
        guard()  # before the commit: a process that lost the lock registers nothing
    errors = iter(register_all(catalog, written, guard) if written else [])
    return [
        w if isinstance(w, Exception) else (next(errors) or (w.metadata_location, w.snapshot_id))
        for w in done
    ]


#: False routes the SQL catalog through `_by_transaction` too (tests of that path: no other
#: catalog runs here).
_REGISTERS_ITSELF = True


def _by_transaction(
    catalog: Catalog, new: NewTable, paths: Sequence[str], summary: Mapping[str, str]
) -> tuple[str, int]:
    """``new`` created with its snapshot by pyiceberg's create transaction and fast append."""
    tx = catalog.create_table_transaction(
        new.identifier, schema=new.schema, location=new.location, properties=dict(new.properties)
    )
    io = (
        tx._table.io
    )  # the staged table's (pyiceberg keeps it private): a REST catalog's credentials
    with tx.update_snapshot(snapshot_properties=dict(summary)).fast_append() as append:
        for path in paths:
            append.append_data_file(data_file(io, tx.table_metadata, path))
    table = tx.commit_transaction()
    snapshot = table.current_snapshot()
    assert snapshot is not None, "a commit makes a snapshot"
    return table.metadata_location, snapshot.snapshot_id


def write(
    catalog: Catalog, new: NewTable, paths: Sequence[str], summary: Mapping[str, str]
) -> Written:
    """The metadata of ``new`` with one snapshot appending ``paths``: the manifest, manifest list
    and metadata file, written but not yet in the catalog (nothing lists them)."""
    metadata = _metadata(new.location, new.schema, new.properties)
    provider = load_location_provider(new.location, metadata.properties)
    metadata_location = provider.new_table_metadata_file_location()
    io = load_file_io({**catalog.properties, **metadata.properties}, metadata_location)
    snapshot_id, commit = metadata.new_snapshot_id(), uuid.uuid4()
    files = [data_file(io, metadata, path) for path in paths]
    # a codec name, as pyiceberg's own writers take it from the table's properties
    compression: Any = metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    manifests = []
    if files:
        manifest_output = io.new_output(provider.new_metadata_location(f"{commit}-m0.avro"))
        with _ManifestWriter(
            metadata.spec(), metadata.schema(), manifest_output, snapshot_id, compression
        ) as writer:
            for file in files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=file,
                    )
                )
        manifests.append(writer.to_manifest_file())
    list_location = provider.new_metadata_location(f"snap-{snapshot_id}-0-{commit}.avro")
    with _ManifestListWriter(
        io.new_output(list_location), snapshot_id, None, 1, compression
    ) as manifest_list:
        manifest_list.add_manifests(manifests)
    collector = SnapshotSummaryCollector(
        partition_summary_limit=int(
            metadata.properties.get(
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
            )
        )
    )
    for file in files:
        collector.add_file(file, schema=metadata.schema(), partition_spec=metadata.spec())
    # pyiceberg's models take their fields by name as pyiceberg builds them (mypy knows the aliases)
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=None,
        manifest_list=list_location,  # type: ignore[call-arg]
        sequence_number=1,
        schema_id=metadata.current_schema_id,
        summary=update_snapshot_summaries(
            Summary(operation=Operation.APPEND, **collector.build(), **summary)
        ),
    )
    main = SnapshotRef(snapshot_id=snapshot_id, snapshot_ref_type=SnapshotRefType.BRANCH)  # type: ignore[call-arg]
    logged = SnapshotLogEntry(snapshot_id=snapshot_id, timestamp_ms=snapshot.timestamp_ms)  # type: ignore[call-arg]
    metadata = metadata.model_copy(
        update={  # what pyiceberg's AddSnapshot and SetSnapshotRef(main) change
            "snapshots": [snapshot],
            "current_snapshot_id": snapshot_id,
            "last_sequence_number": 1,
            "last_updated_ms": snapshot.timestamp_ms,
            "refs": {MAIN_BRANCH: main},
            "snapshot_log": [logged],
        }
    )
    ToOutputFile.table_metadata(metadata, io.new_output(metadata_location))
    return Written(new.identifier, metadata_location, snapshot_id)


def register_all(
    catalog: SqlCatalog, tables: Sequence[Written], guard: Callable[[], None] = lambda: None
) -> list[TableAlreadyExistsError | None]:
    """Put written tables in the SQL catalog; for each, None or the error that it already has one
    of that name (the others are registered all the same).

    They go in one transaction of the catalog's own INSERTs (its ``register_table`` would check
    the namespace and load each table back: a commit and two queries a table); a name it has
    fails the transaction, whose tables are then inserted one by one, after the fence check
    ``guard`` again (another writer registering is what fails the transaction)."""
    rows = [catalog._create_table_row(*_split(t.identifier), t.metadata_location) for t in tables]
    if len(rows) > 1:
        with Session(catalog.engine) as session:
            try:
                session.execute(insert(IcebergTables), rows)
                session.commit()
                return [None] * len(rows)
            except IntegrityError:
                session.rollback()
        guard()
    out: list[TableAlreadyExistsError | None] = []
    for table, row in zip(tables, rows, strict=True):
        with Session(catalog.engine) as session:
            try:
                session.execute(insert(IcebergTables).values(**row))
                session.commit()
                out.append(None)
            except IntegrityError:
                out.append(TableAlreadyExistsError(f"Table {table.identifier} already exists"))
    return out


def known(catalog: Catalog, identifiers: Sequence[str]) -> set[str] | None:
    """Which of ``identifiers`` the catalog has a table (or view) of, in one query a namespace;
    None for a catalog other than SQL (each table is then looked up by loading it). Listing a
    namespace instead would read every name of it for each group of a publish."""
    rows = catalog_rows(catalog, identifiers)
    return None if rows is None else set(rows)


def catalog_rows(catalog: Catalog, identifiers: Iterable[str]) -> dict[str, str | None] | None:
    """The metadata location a SQL catalog's row holds for each of ``identifiers`` it has (one
    query a namespace, no table loaded); None for a catalog other than SQL."""
    if not isinstance(catalog, SqlCatalog):
        return None
    by_namespace: dict[str, dict[str, str]] = {}
    for identifier in identifiers:
        namespace, name = _split(identifier)
        by_namespace.setdefault(namespace, {})[name] = identifier
    found: dict[str, str | None] = {}
    with Session(catalog.engine) as session:
        for namespace, names in by_namespace.items():
            query = select(IcebergTables.table_name, IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name.in_(list(names)),
            )
            for name, metadata in session.execute(query).tuples():
                found[names[name]] = metadata
    return found


def _split(identifier: str) -> tuple[str, str]:
    """An identifier's namespace and table name, as the SQL catalog's rows hold them."""
    return Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(
        identifier
    )


def data_file(io: FileIO, metadata: TableMetadata, path: str) -> DataFile:
    """A Parquet file of the table as its snapshot lists it: size, rows and column statistics
    from the file's footer.

    pyiceberg's `parquet_file_to_data_file` does the same after checking the file's schema against
    the table's with a visitor that renders a `rich` table of every field, a fifth of the CPU of
    publishing a small table. Publish wrote or checked every new file with the table's field IDs,
    types and nullability (`orchestrator.pipeline.publish.staging.place`); here only the columns'
    field IDs are compared, which costs nothing: a file of another table's shape is refused, never
    listed."""
    kept = storage.kept_footer(path)  # publish's, from the staging file it moved here
    if kept is None:
        with io.new_input(path).open() as stream:
            footer = pq.read_metadata(stream)
            nbytes = stream.seek(0, os.SEEK_END)  # its size, known from the open: no request
    else:
        footer, nbytes = kept
    schema = metadata.schema()
    ids = {
        f.name: int((f.metadata or {}).get(FIELD_ID, b"-1"))
        for f in footer.schema.to_arrow_schema()
    }
    wanted = {f.name: f.field_id for f in schema.fields}
    if ids != wanted:
        raise RunFailed(
            f"internal: {path} has the field IDs {ids}, not the Iceberg table's {wanted}: "
            "the version is not committed"
        )
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(metadata.spec(), schema),
        file_size_in_bytes=nbytes,
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


# -------------------------------------------------------------------------- Avro writers built once


@dataclass(frozen=True, slots=True)
class _Kind:
    """One kind of Avro file pyiceberg writes: its schemas, record writer and header JSON."""

    name: str
    file_schema: Schema
    writer: Any
    schema_json: str


def _kind(name: str, file_schema: Schema, record_schema: Schema) -> _Kind:
    return _Kind(
        name,
        file_schema,
        resolve_writer(record_schema=record_schema, file_schema=file_schema),
        json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name=name)),
    )


def _manifest_schema(version: TableVersion) -> Schema:
    """A manifest's entry schema for an unpartitioned table (the same for every such table)."""
    return manifest_entry_schema_with_data_file(
        format_version=version,
        data_file=data_file_with_partition(StructType(), format_version=version),
    )


_MANIFEST = _kind(
    "manifest_entry", _manifest_schema(FORMAT_VERSION), _manifest_schema(DEFAULT_READ_VERSION)
)
_MANIFEST_LIST = _kind(
    "manifest_file",
    MANIFEST_LIST_FILE_SCHEMAS[FORMAT_VERSION],
    MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION],
)
_HEADER = construct_writer(META_SCHEMA)


class _Prebuilt(AvroOutputFile[Any]):
    """pyiceberg's `AvroOutputFile` with the record writer and schema JSON of ``kind``, built once
    (its own constructor resolves the writer, and its header converts the schema, every time)."""

    def __init__(self, output_file: OutputFile, kind: _Kind, metadata: dict[str, str]) -> None:
        # not super().__init__: that is what is built once here
        self.output_file, self.file_schema, self.schema_name = (
            output_file,
            kind.file_schema,
            kind.name,
        )
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer, self.metadata, self._schema_json = kind.writer, metadata, kind.schema_json

    def _write_header(self) -> None:  # as pyiceberg's, the schema's JSON aside
        codec = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec) or codec
        meta = {**self.metadata, "avro.schema": self._schema_json, AVRO_CODEC_KEY: codec}
        _HEADER.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))


class _ManifestWriter(ManifestWriterV2):
    """A v2 manifest of an unpartitioned table, its Avro writer built once (`_Prebuilt`)."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        if not self._spec.is_unpartitioned():
            return super().new_writer()
        return _Prebuilt(self._output_file, _MANIFEST, self._meta)


class _ManifestListWriter(ManifestListWriterV2):
    """A v2 manifest list, its Avro writer built once (`_Prebuilt`)."""

    def __enter__(self) -> ManifestListWriter:
        self._writer = _Prebuilt(self._output_file, _MANIFEST_LIST, self._meta)
        self._writer.__enter__()
        return self
