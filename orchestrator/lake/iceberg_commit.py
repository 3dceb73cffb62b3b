"""A published version becomes one Iceberg snapshot, in one catalog commit.

The snapshot's summary carries ``tidemark.run-id``, ``tidemark.version``,
``tidemark.attempt`` and ``tidemark.position``, so a rerun of a crashed publish finds the
snapshot of its run (`find_run`) and does not commit twice. The first version of a table
new to the catalog is committed together with the table's creation (`iceberg_create`): one
metadata file and one catalog commit, which readers see as a table that has its first
snapshot from the start; a version that changes the table's columns commits the schema
update with its snapshot, in one commit as well (`iceberg.Evolving`). Publish loads the table
once (`iceberg.load`) and hands what it loaded to `find_run_in`, `iceberg.prepare_table` and
`commit_version`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.update.snapshot import UpdateSnapshot, _OverwriteFiles

from orchestrator.lake import iceberg_tx, storage
from orchestrator.lake.iceberg import (
    ATTEMPT,
    NO_COMMIT_RETRIES,
    POSITION,
    RUN_ID,
    VERSION,
    Evolving,
    data_files,
    load,
    table_uri,
)
from orchestrator.lake.iceberg_create import data_file
from orchestrator.lake.manifest import IcebergEntry
from orchestrator.positions import BinlogPosition

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunCommit:
    """The snapshot a run committed: which version, written by which publish attempt."""

    entry: IcebergEntry
    version: int | None
    attempt: str | None  # None: committed before attempts were recorded

    def __str__(self) -> str:
        return (
            f"Iceberg snapshot {self.entry['snapshot_id']} of version {self.version} "
            f"(publish attempt {self.attempt or 'unrecorded'})"
        )


def find_run(catalog: Catalog, table: str, run_id: str) -> RunCommit | None:
    """The snapshot a run committed for ``table``, if it did (the rerun of a crashed publish)."""
    return find_run_in(catalog, table, load(catalog, table), run_id)


def find_run_in(
    catalog: Catalog, table: str, iceberg: Table | None, run_id: str
) -> RunCommit | None:
    """`find_run` in a table already loaded (None: the catalog has no such table)."""
    if iceberg is None:
        return None
    for snapshot in iceberg.snapshots():
        if snapshot.summary is not None and snapshot.summary.get(RUN_ID) == run_id:
            version = snapshot.summary.get(VERSION)
            return RunCommit(
                entry(catalog, table, iceberg, snapshot.snapshot_id),
                int(version) if version else None,
                snapshot.summary.get(ATTEMPT),
            )
    return None


def commit_version(
    catalog: Catalog,
    table: str,
    tdir: str,
    files: Sequence[str],
    *,
    version: int,
    run_id: str,
    position: BinlogPosition,
    attempt: str,
    guard: Callable[[], None] = lambda: None,
    prepared: Table | Evolving | None = None,
) -> IcebergEntry:
    """Make ``files`` (relative to ``tdir``) the table's current Iceberg snapshot, atomically:
    the files not in the current snapshot are added, those no longer listed are removed.
    Committing the same run again returns its snapshot.

    ``guard`` (the fence check) runs after the table is loaded and before the commit: a
    takeover before the load fails the guard, one after it fails the commit, whose parent
    snapshot the catalog checks (compare-and-swap). A writer that lost the pipeline lock cannot
    commit over its successor's versions. ``prepared``: what `iceberg.prepare_table` gave, by a
    caller that found no snapshot of this run (`find_run_in`): neither is done again; a schema
    update it prepared (`iceberg.Evolving`) is committed with the snapshot. (A table new to the
    catalog is created with its first snapshot by `iceberg_create.create_all`.)"""
    if prepared is None:
        done = find_run(catalog, table, run_id)
        prepared = catalog.load_table(table)
        if done is not None:
            guard()
            return done.entry
    evolving = prepared if isinstance(prepared, Evolving) else None
    loaded = evolving.table if evolving is not None else prepared
    assert isinstance(loaded, Table)
    guard()  # before any write: a process that lost the lock commits nothing, not even a property
    wanted = file_uris(tdir, files)
    properties = summary(run_id=run_id, version=version, attempt=attempt, position=position)
    loaded = _without_commit_retries(loaded)
    listed = {f.file_path: f for f in data_files(loaded)}
    tx = iceberg_tx.transaction(loaded)
    if evolving is not None:
        evolving.stage(tx)
    _stage_files(tx, loaded.io, properties, listed, wanted)
    iceberg = tx.commit_transaction()
    current = iceberg.current_snapshot()
    assert current is not None, "a commit makes a snapshot"
    log.debug(
        "table %s: Iceberg snapshot %d for version %d (%d files added, %d removed)",
        table,
        current.snapshot_id,
        version,
        len(set(wanted) - listed.keys()),
        len(listed.keys() - set(wanted)),
    )
    return entry(catalog, table, iceberg, current.snapshot_id)


def file_uris(tdir: str, files: Sequence[str]) -> list[str]:
    """The version's files (relative to ``tdir``) as the snapshot lists them."""
    return [storage.join(table_uri(tdir), f) for f in files]


def summary(*, run_id: str, version: int, attempt: str, position: BinlogPosition) -> dict[str, str]:
    """What a version's snapshot summary carries besides Iceberg's own (`find_run` reads it)."""
    return {
        RUN_ID: run_id,
        VERSION: str(version),
        ATTEMPT: attempt,
        POSITION: json.dumps(position.to_json(), sort_keys=True),
    }


def _without_commit_retries(table: Table) -> Table:
    """``table`` with `iceberg.NO_COMMIT_RETRIES` set (a table created before it was set at
    creation gets it in a commit of its own, once: a commit without a snapshot is never retried).
    That commit asserts nothing and refreshes ``table`` to what the catalog holds: a table
    another writer changed since ``table`` was loaded fails here, as the snapshot's commit would
    have (its compare-and-swap is against the table as loaded)."""
    if all(table.properties.get(k) == v for k, v in NO_COMMIT_RETRIES.items()):
        return table
    loaded = _state(table)
    with table.transaction() as tx:
        tx.set_properties(NO_COMMIT_RETRIES)
    if _state(table) != loaded:
        raise CommitFailedException(
            f"table {table.name()} changed since it was loaded: another writer committed"
        )
    return table


def _state(table: Table) -> tuple[int | None, int, int]:
    """What a version's commit is built on: the current snapshot, schema and last field ID."""
    return (
        table.metadata.current_snapshot_id,
        table.metadata.current_schema_id,
        table.metadata.last_column_id,
    )


def _stage_files(
    tx: Transaction,
    io: FileIO,
    properties: dict[str, str],
    listed: dict[str, DataFile],
    wanted: Sequence[str],
) -> None:
    """Stage in ``tx`` the snapshot whose files are ``wanted``, the current ones being ``listed``:
    a fast append when nothing is listed (a table without a snapshot), else `_overwrite`."""
    update = tx.update_snapshot(snapshot_properties=properties)
    with _overwrite(update) if listed else update.fast_append() as snapshot:
        for path in listed.keys() - set(wanted):
            snapshot.delete_data_file(listed[path])
        for path in wanted:
            if path not in listed:
                snapshot.append_data_file(data_file(io, tx.table_metadata, path))


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


def entry(catalog: Catalog, table: str, iceberg: Table, snapshot_id: int) -> IcebergEntry:
    """The manifest's ``iceberg`` entry naming ``snapshot_id`` of ``iceberg`` as now committed."""
    return IcebergEntry(
        catalog=catalog.name,
        identifier=table,
        metadata_location=iceberg.metadata_location,
        snapshot_id=snapshot_id,
    )
