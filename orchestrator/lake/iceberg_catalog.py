"""A SQL catalog that parses each table metadata file once, not at every load.

pyiceberg's SQL catalog (0.12) loads a table by reading its row (which names the table's
current metadata file) and then reading and parsing that file, a JSON document validated into
pydantic models: for a small table, most of a load's time. Publish loads the table
(`iceberg.load`), and the catalog loads it again inside `commit_table` to check the commit's
requirements against the table as it is now; where retention expires a version
(`iceberg.expire_versions`), it loads the table at its new metadata file, the catalog loads it
to check the expiry's commit, and the expiry refreshes it: five parses a version, of two files.
Where many tables each changed a little, those parses are a large share of publish
(docs/performance.md, "Many small tables").

An Iceberg metadata file is written once and never changed: a commit writes a new file under
a new name (its version and a UUID) and moves the catalog's row to it. So the row is the only
thing that can be stale, and it is still read at every load: when it names the metadata file
the catalog last parsed or wrote for that table, the parsed metadata is current, and is
reused. The catalog's compare-and-swap (an UPDATE on the row's old metadata location) stays
what fences concurrent writers: nothing here decides whether a commit may happen.

pyiceberg's metadata models are frozen (``IcebergBaseModel``), and its updates derive new
metadata rather than change the old, so sharing one between the tables loaded from it is
safe (`iceberg_tx` relies on the same). One metadata is kept per table, the current one.
"""

from __future__ import annotations

import threading
from typing import cast

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate

from orchestrator.state.store import unprepared


class ParsingOnce(SqlCatalog):
    """`SqlCatalog`, reusing a table's parsed metadata while its row names the same file."""

    _parsed: dict[tuple[str, str], tuple[str, TableMetadata]]
    _parsed_lock: threading.Lock

    def _convert_orm_to_iceberg(self, orm_table: IcebergTables) -> Table:
        namespace, name = str(orm_table.table_namespace), str(orm_table.table_name)
        location = orm_table.metadata_location
        known = self._parsed.get((namespace, name))
        if location and known is not None and known[0] == location:
            metadata = known[1]
            return Table(
                identifier=(*Catalog.identifier_to_tuple(namespace), name),
                metadata=metadata,
                metadata_location=location,
                io=self._load_file_io(metadata.properties, location),
                catalog=self,
            )
        table = super()._convert_orm_to_iceberg(orm_table)
        self._remember(namespace, name, table.metadata_location, table.metadata)
        return table

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        response = super().commit_table(table, requirements, updates)
        namespace, name = (
            Catalog.namespace_from(table.name()),
            Catalog.table_name_from(table.name()),
        )
        self._remember(
            Catalog.namespace_to_string(namespace),
            name,
            response.metadata_location,
            response.metadata,
        )
        return response

    def _remember(self, namespace: str, name: str, location: str, metadata: TableMetadata) -> None:
        with self._parsed_lock:
            self._parsed[(namespace, name)] = (location, metadata)


def parsing_once(catalog: Catalog) -> Catalog:
    """``catalog``, made a `ParsingOnce` when it is pyiceberg's own SQL catalog (as
    `pyiceberg.catalog.load_catalog` made it: its configuration, merged from every source
    pyiceberg reads, stays as it is); any other catalog is returned as it is."""
    if type(catalog) is SqlCatalog:
        catalog.__class__ = ParsingOnce
        once = cast(ParsingOnce, catalog)
        once._parsed = {}
        once._parsed_lock = threading.Lock()
        unprepared(once.engine)  # as the state store's, which it often shares a database with
    return catalog
