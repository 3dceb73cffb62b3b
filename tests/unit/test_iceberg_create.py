"""orchestrator.lake.iceberg_create: a new table created with its first snapshot writes what
pyiceberg's own create transaction writes for the same files (metadata, manifests, manifest
list, summary), and readers (pyiceberg, DuckDB) read it as the files' rows. A SQLite catalog,
no server."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io.pyarrow import parquet_file_to_data_file, pyarrow_to_schema
from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table

from orchestrator.lake import iceberg, iceberg_create
from tests.iceberg_readers import duckdb_connection

#: Arrow types publish writes (docs: the type mapping), nullable and not.
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("small", pa.int32()),
        pa.field("flag", pa.bool_()),
        pa.field("price", pa.decimal128(12, 3)),
        pa.field("ratio", pa.float64()),
        pa.field("f", pa.float32()),
        pa.field("name", pa.string(), nullable=False),
        pa.field("blob", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("us")),
        pa.field("utc", pa.timestamp("us", tz="UTC")),
        pa.field("t", pa.time64("us")),
    ]
)
SUMMARY = {"tidemark.run-id": "run-1", "tidemark.version": "1", "tidemark.attempt": "a1b2c3d4"}
#: The parts of a table's metadata that differ between any two creations.
VARYING = {
    "table-uuid",
    "last-updated-ms",
    "current-snapshot-id",
    "snapshots",
    "snapshot-log",
    "refs",
}


def rows(n: int, offset: int = 0) -> pa.Table:
    ids = range(offset, offset + n)
    return pa.table(
        {
            "id": list(ids),
            "small": [None if i % 7 == 0 else i - 50 for i in ids],
            "flag": [i % 2 == 0 for i in ids],
            "price": [decimal.Decimal(i) / 8 for i in ids],
            "ratio": [i / 3 for i in ids],
            "f": [float(i) for i in ids],
            "name": [f"n{i:05d}" for i in ids],
            "blob": [None if i % 5 == 0 else bytes([i % 256]) * 3 for i in ids],
            "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in ids],
            "at": [dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i) for i in ids],
            "utc": [dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=i) for i in ids],
            "t": [dt.time(i % 24, i % 60) for i in ids],
        },
        schema=iceberg.with_field_ids(SCHEMA, {f.name: i for i, f in enumerate(SCHEMA, start=1)}),
    )


def table_with_files(tmp_path: Path, name: str, parts: list[pa.Table]) -> tuple[str, list[str]]:
    """A table dir holding ``parts`` as data files; its URI and the files' URIs."""
    data = tmp_path / "lake" / name / "data"
    data.mkdir(parents=True)
    for i, part in enumerate(parts):
        pq.write_table(part, data / f"f{i}.parquet")
    location = iceberg.table_uri(str(data.parent))
    return location, [f"{location}/data/f{i}.parquet" for i in range(len(parts))]


def catalog_at(tmp_path: Path) -> Catalog:
    catalog = load_catalog("c", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}")
    catalog.create_namespace("db")
    return catalog


def created_by_pyiceberg(
    catalog: Catalog, identifier: str, location: str, files: list[str]
) -> Table:
    """What publish did before `iceberg_create`: pyiceberg's create transaction and fast append."""
    tx = catalog.create_table_transaction(
        identifier,
        schema=pyarrow_to_schema(iceberg._first_schema(SCHEMA)),
        location=location,
        properties=iceberg._TABLE_PROPERTIES,
    )
    with tx.update_snapshot(snapshot_properties=SUMMARY).fast_append() as append:
        for path in files:
            append.append_data_file(
                parquet_file_to_data_file(tx._table.io, tx.table_metadata, path)
            )
    return tx.commit_transaction()


def create(catalog: Catalog, new: iceberg_create.NewTable, files: list[str]) -> tuple[str, int]:
    """`iceberg_create.create_all` of one table: its metadata location and snapshot ID, or its
    error raised."""
    [done] = iceberg_create.create_all(catalog, [(new, files, SUMMARY)])
    if isinstance(done, Exception):
        raise done
    return done


def created_here(catalog: Catalog, identifier: str, location: str, files: list[str]) -> Table:
    new = iceberg_create.NewTable(
        identifier,
        location,
        pyarrow_to_schema(iceberg._first_schema(SCHEMA)),
        iceberg._TABLE_PROPERTIES,
    )
    metadata_location, snapshot_id = create(catalog, new, files)
    table = catalog.load_table(identifier)
    assert table.metadata_location == metadata_location
    assert table.current_snapshot().snapshot_id == snapshot_id  # type: ignore[union-attr]
    return table


def described(table: Table) -> dict[str, Any]:
    """Everything of a created table that does not differ between two creations of it."""
    metadata = table.metadata.model_dump(by_alias=True)
    location = table.metadata.location
    [snapshot] = table.snapshots()
    manifests = snapshot.manifests(table.io)
    entries = [
        e for m in manifests for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    ]
    return {
        "metadata": {k: v for k, v in metadata.items() if k not in VARYING and k != "location"},
        "snapshot": {
            "sequence": snapshot.sequence_number,
            "parent": snapshot.parent_snapshot_id,
            "schema": snapshot.schema_id,
            "summary": snapshot.summary.model_dump()  # type: ignore[union-attr]
            if snapshot.summary
            else None,
            "log": len(table.metadata.snapshot_log),
            "refs": sorted(table.metadata.refs),
        },
        "manifests": [_manifest(m, location) for m in manifests],
        "entries": [
            {
                "status": e.status,
                "sequence": e.sequence_number,
                "file_sequence": e.file_sequence_number,
                "snapshot": e.snapshot_id == snapshot.snapshot_id,
                "file": {
                    **{k: getattr(e.data_file, k) for k in _DATA_FILE_FIELDS},
                    "file_path": e.data_file.file_path.removeprefix(location),
                },
            }
            for e in entries
        ],
        "avro": [_avro_header(table, m.manifest_path) for m in manifests]
        + [_avro_header(table, snapshot.manifest_list)],
    }


_DATA_FILE_FIELDS = (
    "content",
    "file_format",
    "record_count",
    "file_size_in_bytes",
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
    "split_offsets",
    "sort_order_id",
    "spec_id",
    "equality_ids",
    "partition",
)


def _manifest(manifest: ManifestFile, location: str) -> dict[str, Any]:
    return {
        "content": manifest.content,
        "spec": manifest.partition_spec_id,
        "sequence": manifest.sequence_number,
        "min_sequence": manifest.min_sequence_number,
        "added": (manifest.added_files_count, manifest.added_rows_count),
        "existing": (manifest.existing_files_count, manifest.existing_rows_count),
        "deleted": (manifest.deleted_files_count, manifest.deleted_rows_count),
        "partitions": manifest.partitions,
        "length": manifest.manifest_length > 0,
        "in_metadata": manifest.manifest_path.startswith(location + "/metadata/"),
    }


def _avro_header(table: Table, path: str) -> dict[str, str]:
    """An Avro file's header metadata (the schema JSON, codec, Iceberg's keys)."""
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.file import META_SCHEMA, AvroFileHeader
    from pyiceberg.avro.resolver import construct_reader

    with table.io.new_input(path).open() as stream:
        decoder = new_decoder(stream.read())
    header: AvroFileHeader = construct_reader(META_SCHEMA, {-1: AvroFileHeader}).read(decoder)
    return {
        k: v for k, v in header.meta.items() if k != "snapshot-id" and k != "parent-snapshot-id"
    }


def test_a_created_table_is_what_pyiceberg_creates_from_the_same_files(tmp_path: Path) -> None:
    catalog = catalog_at(tmp_path)
    parts = [rows(300), rows(200, offset=300)]
    theirs = created_by_pyiceberg(
        catalog, "db.theirs", *table_with_files(tmp_path, "theirs", parts)
    )
    ours = created_here(catalog, "db.ours", *table_with_files(tmp_path, "ours", parts))
    expected, got = described(theirs), described(ours)
    assert got["entries"][0]["file"]["lower_bounds"], "statistics to compare"
    assert got["avro"][0]["avro.schema"], "headers to compare"
    for part in expected:
        assert got[part] == expected[part], part
    assert ours.metadata.location == iceberg.table_uri(str(tmp_path / "lake" / "ours"))
    assert ours.metadata.last_updated_ms == ours.current_snapshot().timestamp_ms  # type: ignore[union-attr]
    assert ours.metadata.snapshot_log[0].snapshot_id == ours.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert ours.metadata.refs["main"].snapshot_id == ours.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_readers_read_the_files_rows(tmp_path: Path) -> None:
    catalog = catalog_at(tmp_path)
    parts = [rows(40), rows(25, offset=40)]
    table = created_here(catalog, "db.t", *table_with_files(tmp_path, "t", parts))
    expected = pa.concat_tables(parts).cast(SCHEMA).to_pylist()
    assert table.scan().to_arrow().sort_by("id").cast(SCHEMA).to_pylist() == expected
    con = duckdb_connection()
    try:
        read = con.execute(
            "SELECT * FROM iceberg_scan(?) ORDER BY id", [table.metadata_location]
        ).fetch_arrow_table()
    finally:
        con.close()
    assert read.column("id").to_pylist() == list(range(65))
    assert read.column("name").to_pylist() == [f"n{i:05d}" for i in range(65)]
    assert read.column("price").to_pylist() == [decimal.Decimal(i) / 8 for i in range(65)]


def test_a_name_the_catalog_has_is_refused_and_its_table_kept(tmp_path: Path) -> None:
    catalog = catalog_at(tmp_path)
    first = created_here(catalog, "db.t", *table_with_files(tmp_path, "t", [rows(10)]))
    location, files = table_with_files(tmp_path, "again", [rows(20)])
    new = iceberg_create.NewTable(
        "db.t", location, pyarrow_to_schema(iceberg._first_schema(SCHEMA)), {}
    )
    with pytest.raises(TableAlreadyExistsError):
        create(catalog, new, files)
    kept = catalog.load_table("db.t")
    assert kept.metadata_location == first.metadata_location
    assert len(kept.scan().to_arrow()) == 10


def test_a_file_of_other_field_ids_is_refused_before_anything_is_registered(tmp_path: Path) -> None:
    from orchestrator.errors import RunFailed

    catalog = catalog_at(tmp_path)
    location, files = table_with_files(
        tmp_path, "t", [rows(10).replace_schema_metadata(None).cast(SCHEMA)]
    )
    new = iceberg_create.NewTable(
        "db.t", location, pyarrow_to_schema(iceberg._first_schema(SCHEMA)), {}
    )
    with pytest.raises(RunFailed, match="not the Iceberg table's"):
        create(catalog, new, files)
    assert not catalog.table_exists("db.t")


def test_a_group_is_registered_together_and_a_name_taken_fails_that_table_alone(
    tmp_path: Path,
) -> None:
    catalog = catalog_at(tmp_path)
    taken = created_here(catalog, "db.b", *table_with_files(tmp_path, "b0", [rows(3)]))
    schema = pyarrow_to_schema(iceberg._first_schema(SCHEMA))
    written = []
    for name, count in (("a", 5), ("b", 6), ("c", 7)):
        location, files = table_with_files(tmp_path, name, [rows(count)])
        written.append(
            iceberg_create.write(
                catalog, iceberg_create.NewTable(f"db.{name}", location, schema, {}), files, SUMMARY
            )
        )
    assert not catalog.table_exists("db.a"), "written, not registered"
    errors = iceberg_create.register_all(catalog, written)
    assert [e is None for e in errors] == [True, False, True]
    assert isinstance(errors[1], TableAlreadyExistsError)
    assert len(catalog.load_table("db.a").scan().to_arrow()) == 5
    assert len(catalog.load_table("db.c").scan().to_arrow()) == 7
    assert catalog.load_table("db.b").metadata_location == taken.metadata_location
    more = [
        iceberg_create.write(
            catalog,
            iceberg_create.NewTable(
                f"db.{n}", *table_with_files(tmp_path, n, [rows(2)])[:1], schema, {}
            ),
            [],
            SUMMARY,
        )
        for n in ("d", "e")
    ]
    assert iceberg_create.register_all(catalog, more) == [None, None], (
        "one transaction for the group"
    )
    assert {".".join(t) for t in catalog.list_tables("db")} == {
        "db.a",
        "db.b",
        "db.c",
        "db.d",
        "db.e",
    }
    assert iceberg_create.known(catalog, ["db.a", "db.x", "db.e", "other.a"]) == {"db.a", "db.e"}
    assert catalog.load_table("db.d").scan().to_arrow().num_rows == 0, "a snapshot of no files"


def test_after_a_taken_name_fails_the_group_the_fence_is_checked_before_each_is_registered(
    tmp_path: Path,
) -> None:
    catalog = catalog_at(tmp_path)
    created_here(catalog, "db.b", *table_with_files(tmp_path, "b0", [rows(3)]))
    schema = pyarrow_to_schema(iceberg._first_schema(SCHEMA))
    checks: list[int] = []
    creating: list[iceberg_create.Creating] = []
    for name in ("a", "b"):
        location, files = table_with_files(tmp_path, name, [rows(4)])
        creating.append(
            (iceberg_create.NewTable(f"db.{name}", location, schema, {}), files, SUMMARY)
        )
    done = iceberg_create.create_all(catalog, creating, lambda: checks.append(1))
    assert isinstance(done[1], TableAlreadyExistsError) and not isinstance(done[0], Exception)
    assert len(checks) == 3, (
        "before the writes, before the group's commit, before the inserts one by one"
    )

    class Lost(Exception):
        pass

    def lost() -> None:
        raise Lost("the lock was lost")

    new = iceberg_create.NewTable(
        "db.c", *table_with_files(tmp_path, "c", [rows(2)])[:1], schema, {}
    )
    with pytest.raises(Lost):
        iceberg_create.create_all(catalog, [(new, [], SUMMARY)], lost)
    assert not catalog.table_exists("db.c"), "nothing registered by a process that lost the lock"


def test_a_catalog_other_than_sql_keeps_pyiceberg_s_create_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No REST, Glue or Hive catalog runs here: the SQL catalog is routed through that path."""
    catalog = catalog_at(tmp_path)
    parts = [rows(30), rows(20, offset=30)]
    lean = created_here(catalog, "db.lean", *table_with_files(tmp_path, "lean", parts))
    created_here(catalog, "db.taken", *table_with_files(tmp_path, "taken", [rows(1)]))
    monkeypatch.setattr(iceberg_create, "_REGISTERS_ITSELF", False)
    schema = pyarrow_to_schema(iceberg._first_schema(SCHEMA))
    location, files = table_with_files(tmp_path, "tx", parts)
    taken_location, taken_files = table_with_files(tmp_path, "taken2", [rows(2)])
    done = iceberg_create.create_all(
        catalog,
        [
            (
                iceberg_create.NewTable("db.tx", location, schema, iceberg._TABLE_PROPERTIES),
                files,
                SUMMARY,
            ),
            (iceberg_create.NewTable("db.taken", taken_location, schema, {}), taken_files, SUMMARY),
        ],
    )
    assert isinstance(done[1], Exception) and "already exists" in str(done[1]), done[
        1
    ]  # pyiceberg's own error
    assert not isinstance(done[0], Exception)
    table = catalog.load_table("db.tx")
    assert (table.metadata_location, table.current_snapshot().snapshot_id) == done[0]  # type: ignore[union-attr]
    expected, got = described(lean), described(table)
    for part in expected:
        assert got[part] == expected[part], part
    assert len(catalog.load_table("db.taken").scan().to_arrow()) == 1, "the taken table kept"
