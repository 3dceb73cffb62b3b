"""orchestrator.lake.iceberg: every published version is an Iceberg snapshot (pyarrow, pyiceberg,
DuckDB; a SQLite catalog, no server)."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.app.demo.command import duckdb_query
from orchestrator.config import PipelineConfig, parse_config
from orchestrator.errors import ConfigError
from orchestrator.lake import iceberg
from orchestrator.lake.manifest import (
    IcebergEntry,
    Manifest,
    newest_field_ids,
    published_schema,
    read_manifest,
)
from orchestrator.lake.writer import FIELD_ID, with_field_ids
from orchestrator.pipeline.publish.versions import publish_table
from orchestrator.pipeline.reconcile.rewrite import (
    Target,
    published_ids_first,
    reconcile_incremental,
)
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import staging_schema
from tests.iceberg_readers import duckdb_connection, duckdb_table, field_ids, pyiceberg_table
from tests.unit.test_manifest import TABLE, write_staging

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import InputFile
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata
    from pyspark.sql import SparkSession


def config_for(tmp_path: Path, keep: int = 2) -> PipelineConfig:
    return parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {"path": str(tmp_path / "lake"), "keep_versions": keep, "keep_hours": 0},
            "state": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "tables": [{"name": "db.t"}],
        },
        check_env=False,
    )


def rows_of(n: int) -> list[dict[str, object]]:
    return [{"id": i, "d": None, "t": -i * n, "big": f"{i}.{n:02d}"} for i in range(5 * n)]


def publish(config: PipelineConfig, tmp_path: Path, n: int) -> dict[str, object]:
    staging = tmp_path / f"s{n}"
    directory = str(staging) if staging.exists() else write_staging(staging, rows_of(n))
    return dict(
        publish_table(
            config, TABLE, ("id",), directory, BinlogPosition(f"binlog.{n:06d}", 4), f"run-{n}"
        )
    )


def by_id(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(rows, key=lambda r: int(str(r["id"])))


def test_each_version_is_a_snapshot_and_retention_expires_the_dropped_ones(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    tdir = tmp_path / "lake" / "db" / "t"
    for n in range(1, 5):
        manifest = publish(config, tmp_path, n)
        entry = manifest["iceberg"]
        assert (
            isinstance(entry, dict)
            and entry["catalog"] == "tidemark"
            and entry["identifier"] == "db.t"
        )
        table = iceberg.open_catalog(config).load_table("db.t")
        assert entry["metadata_location"] == table.metadata_location
        assert entry["snapshot_id"] == table.current_snapshot().snapshot_id  # type: ignore[union-attr]
        summary = table.current_snapshot().summary  # type: ignore[union-attr]
        assert summary is not None and summary["tidemark.run-id"] == f"run-{n}"
        assert summary["tidemark.version"] == str(n)
        assert json.loads(summary["tidemark.position"])["file"] == f"binlog.{n:06d}"
        expected = by_id(rows_of(n))
        assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == expected
        assert by_id(duckdb_table(str(tdir)).to_pylist()) == expected
        assert json.loads((tdir / "_tidemark" / "current.json").read_text())["iceberg"] == entry
    table = iceberg.open_catalog(config).load_table("db.t")
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["3", "4"]
    listed = {
        t.file.file_path
        for s in table.snapshots()
        for t in table.scan(snapshot_id=s.snapshot_id).plan_files()
    }
    on_disk = {f"file://{p}" for p in (tdir / "data").iterdir()}
    assert listed == on_disk, "retention keeps exactly the files a kept snapshot lists"
    first = sorted((tdir / "data").iterdir())[0]
    assert field_ids(str(first)) == {f.name: f.field_id for f in table.schema().fields}
    assert {f.name: str(f.field_type) for f in table.schema().fields} == {
        "id": "long",
        "d": "date",
        "t": "long",
        "big": "string",
    }


def test_a_snapshot_lists_only_manifests_with_live_files_or_its_own_deletes(tmp_path: Path) -> None:
    config = config_for(tmp_path, keep=10)
    for n in range(1, 7):
        publish(config, tmp_path, n)
        table = iceberg.open_catalog(config).load_table("db.t")
        current = table.current_snapshot()
        assert current is not None
        manifests = current.manifests(table.io)
        stale = [
            m.manifest_path
            for m in manifests
            if m.added_snapshot_id != current.snapshot_id
            and not (m.has_added_files() or m.has_existing_files())
        ]
        assert stale == [], f"version {n} carries manifests of files earlier snapshots deleted"
        assert len(manifests) <= 2, "the version's added files and the files it deleted"
        assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == by_id(rows_of(n))


def test_a_new_table_is_created_with_its_first_snapshot_in_one_catalog_commit(
    tmp_path: Path,
) -> None:
    """One metadata file and one catalog row, not a table without snapshot committed first."""
    config = config_for(tmp_path)
    manifest = publish(config, tmp_path, 1)
    table = iceberg.open_catalog(config).load_table("db.t")
    metadata = sorted(
        p.name for p in (tmp_path / "lake" / "db" / "t" / "metadata").glob("*.metadata.json")
    )
    assert len(metadata) == 1 and metadata[0].startswith("00000-"), metadata
    assert table.metadata.metadata_log == [], (
        "no earlier metadata: the table had a snapshot from its first commit"
    )
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["1"]
    assert manifest["iceberg"] == {
        "catalog": "tidemark",
        "identifier": "db.t",
        "snapshot_id":  # type: ignore[comparison-overlap]
        table.current_snapshot().snapshot_id,  # type: ignore[union-attr]
        "metadata_location": table.metadata_location,
    }
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == by_id(rows_of(1))
    publish(config, tmp_path, 2)
    assert iceberg.open_catalog(config).namespace_exists("db")


def _publish_and_crash(tmp_path: Path, n: int) -> None:
    os.environ["TIDEMARK_FAILPOINT"] = "publish.iceberg_committed"
    publish(config_for(tmp_path), tmp_path, n)


@pytest.mark.parametrize("n", [1, 2], ids=["new table", "next version"])
def test_a_crash_between_the_iceberg_commit_and_the_manifest_switch_commits_once(
    tmp_path: Path, n: int
) -> None:
    config = config_for(tmp_path)
    if n == 2:
        publish(config, tmp_path, 1)
    write_staging(tmp_path / f"s{n}", rows_of(n))
    child = multiprocessing.get_context("fork").Process(
        target=_publish_and_crash, args=(tmp_path, n)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -9, "the failpoint kills the publish after the Iceberg commit"
    tdir = tmp_path / "lake" / "db" / "t"
    current = tdir / "_tidemark" / "current.json"
    assert (json.loads(current.read_text())["version"] if current.exists() else None) == (
        1 if n == 2 else None
    )
    manifest = publish(config, tmp_path, n)
    table = iceberg.open_catalog(config).load_table("db.t")
    runs = [s.summary["tidemark.run-id"] for s in table.snapshots() if s.summary]
    assert runs == [f"run-{v}" for v in range(1, n + 1)], (
        "the rerun found its snapshot and did not commit again"
    )
    assert (
        manifest["version"] == n
        and manifest["iceberg"]["snapshot_id"] == table.current_snapshot().snapshot_id
    )  # type: ignore[index,union-attr]
    assert by_id(duckdb_table(str(tdir)).to_pylist()) == by_id(rows_of(n))


def test_the_demo_duckdb_line_reads_the_table(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    manifest = publish(config, tmp_path, 3)
    line = duckdb_query(manifest["iceberg"]["metadata_location"])  # type: ignore[index]
    select = line.split("LOAD iceberg; ", 1)[1].rstrip(
        '"'
    )  # offline: the extension is loaded from its package
    con = duckdb_connection()
    assert con.execute(select).fetchall() == [(15,)]
    con.close()


@pytest.mark.parametrize(
    ("properties", "problem"),
    [
        ({"type": "nessie"}, "output.catalog.type: expected one of"),
        ({"name": "bad name"}, "output.catalog.name: expected letters"),
        ({"uri": ["a"]}, "output.catalog.uri: expected"),
    ],
)
def test_catalog_config_errors_name_the_key(properties: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config(
            {
                "pipeline": "p",
                "source": {"host": "h", "user": "u", "server_id": 1},
                "output": {"path": "/lake", "catalog": properties},
                "state": {"url": "sqlite://"},
                "tables": [{"name": "db.t"}],
            },
            check_env=False,
        )


def test_the_default_catalog_is_sql_in_the_state_store(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    durable = {"py-io-impl": "orchestrator.lake.iceberg_io.DurableFileIO"}  # a local lake
    assert iceberg.catalog_properties(config) == {
        **durable,
        "type": "sql",
        "uri": f"{config.state.url}?timeout=30",
    }
    rest = parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {
                "path": "/lake",
                "catalog": {
                    "name": "prod",
                    "type": "rest",
                    "uri": "http://c:8181",
                    "s3.region": "eu-west-1",
                    "rest.sigv4-enabled": True,
                },
            },
            "state": {"url": "sqlite://"},
            "tables": [{"name": "db.t"}],
        },
        check_env=False,
    )
    assert rest.output.catalog.name == "prod"
    assert iceberg.catalog_properties(rest) == {
        "type": "rest",
        "uri": "http://c:8181",
        "s3.region": "eu-west-1",
        "rest.sigv4-enabled": "true",
    }  # the server writes its metadata
    own = parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {
                "path": "/lake",
                "catalog": {"py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"},
            },
            "state": {"url": "sqlite://"},
            "tables": [{"name": "db.t"}],
        },
        check_env=False,
    )
    assert (
        iceberg.catalog_properties(own)["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"
    )  # theirs kept


def test_a_new_column_gets_a_new_field_id_and_old_ids_stay(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    publish(config, tmp_path, 1)
    wider = TableInfo(
        "db",
        "t",
        (*TABLE.columns[:2], *TABLE.columns[3:], ColumnInfo("note", "varchar", "varchar(9)", True)),
        ("id",),
        (),
        0,
    )
    staging = tmp_path / "wide"
    staging.mkdir()
    schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(wider.columns))
    rows = [{"id": i, "d": None, "big": f"{i}.5", "note": f"n{i}"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), staging / "part-00000.parquet")
    publish_table(
        config, wider, ("id",), str(staging), BinlogPosition("binlog.000009", 4), "run-wide"
    )
    table = iceberg.open_catalog(config).load_table("db.t")
    assert {f.name: f.field_id for f in table.schema().fields} == {
        "id": 1,
        "d": 2,
        "big": 4,
        "note": 5,
    }
    assert len(table.metadata.metadata_log) == 1, "the schema change committed with the snapshot"
    assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == rows
    assert by_id(duckdb_table(str(tmp_path / "lake" / "db" / "t")).to_pylist()) == rows


def test_a_type_iceberg_cannot_promote_replaces_the_column(tmp_path: Path) -> None:
    """TIME (long) -> VARCHAR (string): the old field is dropped, a new one of the same name gets a
    new ID; the other IDs stay, and the old snapshot still reads with its own schema."""
    config = config_for(tmp_path, keep=5)
    first = publish(config, tmp_path, 1)
    changed = TableInfo(
        "db",
        "t",
        (*TABLE.columns[:2], ColumnInfo("t", "varchar", "varchar(9)", True), TABLE.columns[3]),
        ("id",),
        (),
        0,
    )
    staging = tmp_path / "changed"
    staging.mkdir()
    schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(changed.columns))
    rows = [{"id": i, "d": None, "t": f"t{i}", "big": f"{i}.5"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), staging / "part-00000.parquet")
    commits = len(iceberg.open_catalog(config).load_table("db.t").metadata.metadata_log)
    publish_table(
        config, changed, ("id",), str(staging), BinlogPosition("binlog.000009", 4), "run-changed"
    )
    table = iceberg.open_catalog(config).load_table("db.t")
    assert [(f.name, f.field_id, str(f.field_type)) for f in table.schema().fields] == [
        ("id", 1, "long"),
        ("d", 2, "date"),
        ("t", 5, "string"),
        ("big", 4, "string"),
    ], "in the source's order"
    # the column replaced, put back in place and the snapshot: one commit, so no reader saw the new
    # schema over the old files (the replaced column read as NULL), nor can a crash leave it so
    assert len(table.metadata.metadata_log) == commits + 1
    assert table.current_snapshot().schema_id == table.metadata.current_schema_id  # type: ignore[union-attr]
    assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == rows
    tdir = tmp_path / "lake" / "db" / "t"
    assert by_id(duckdb_table(str(tdir)).to_pylist()) == rows
    assert all(
        field_ids(str(tdir / f))["t"] == 5
        for f in json.loads((tdir / "_tidemark/current.json").read_text())["files"]
    )
    old = table.scan(snapshot_id=first["iceberg"]["snapshot_id"]).to_arrow().to_pylist()  # type: ignore[index]
    assert by_id(old) == by_id(rows_of(1)), "the old snapshot reads with its own schema"
    schemas = len(table.metadata.schemas)
    publish_table(
        config, changed, ("id",), str(staging), BinlogPosition("binlog.000010", 4), "run-again"
    )
    assert len(iceberg.open_catalog(config).load_table("db.t").metadata.schemas) == schemas, (
        "a schema already in the source's order is no change"
    )


def test_metadata_files_of_expired_snapshots_are_deleted(tmp_path: Path) -> None:
    """After many versions with keep_versions 2, metadata/ holds the manifest lists and manifests
    of the kept snapshots only, and a bounded number of metadata.json files."""
    config = config_for(tmp_path, keep=2)
    tdir = tmp_path / "lake" / "db" / "t"
    for n in range(1, 16):
        publish(config, tmp_path, n)
    table = iceberg.open_catalog(config).load_table("db.t")
    assert len(table.snapshots()) == 2
    referenced = {s.manifest_list for s in table.snapshots()}
    referenced |= {m.manifest_path for s in table.snapshots() for m in s.manifests(table.io)}
    on_disk = {f"file://{p}" for p in (tdir / "metadata").glob("*.avro")}
    assert on_disk == referenced, "exactly the kept snapshots' manifest lists and manifests"
    assert len(list((tdir / "metadata").glob("*.metadata.json"))) <= 11
    assert by_id(duckdb_table(str(tdir)).to_pylist()) == by_id(rows_of(15))
    previous = json.loads((tdir / "_tidemark" / "versions" / "000014.json").read_text())["iceberg"]
    con = duckdb_connection()
    rows = con.execute(
        "SELECT count(*) FROM iceberg_scan(?)", [previous["metadata_location"]]
    ).fetchall()
    con.close()
    assert rows == [(70,)], "the kept previous version still reads through its own metadata file"


def commit_empty(
    catalog: Catalog, tdir: str, version: int, run_id: str, prepared: Table
) -> IcebergEntry:
    """`commit_version` of a version of no file, on the table as ``prepared`` holds it."""
    from orchestrator.lake.iceberg_commit import commit_version

    return commit_version(
        catalog,
        "db.t",
        tdir,
        [],
        version=version,
        run_id=run_id,
        position=BinlogPosition(f"binlog.{version:06d}", 4),
        attempt="a",
        prepared=prepared,
    )


def test_a_commit_that_lost_the_race_fails_instead_of_landing_on_the_newer_table(
    tmp_path: Path,
) -> None:
    """A writer holding the table as it was (a stale process) commits after another version
    landed: the catalog's compare-and-swap refuses it, and it is not retried on top of the newer
    snapshot (pyiceberg retries a failed commit by default)."""
    from pyiceberg.exceptions import CommitFailedException

    config = config_for(tmp_path, keep=5)
    publish(config, tmp_path, 1)
    stale = iceberg.open_catalog(config).load_table("db.t")
    assert stale.properties["commit.retry.num-retries"] == "0"
    publish(config, tmp_path, 2)  # the successor's version
    tdir = str(tmp_path / "lake" / "db" / "t")
    with pytest.raises(CommitFailedException):
        commit_empty(iceberg.open_catalog(config), tdir, 3, "stale", stale)
    table = iceberg.open_catalog(config).load_table("db.t")
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["1", "2"]


def test_a_metadata_file_is_parsed_once_while_the_catalog_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish loads the table, the catalog loads it again to check the commit, retention loads
    it at its new metadata file: one parse (the first load's), the others reuse it. A table
    another writer changed is parsed again, and a commit on the table as it was still fails."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.serializers import FromInputFile

    from orchestrator.lake.iceberg_catalog import ParsingOnce

    parsed: list[str] = []
    parse = FromInputFile.table_metadata

    def counted(file: InputFile, encoding: str = "utf-8") -> TableMetadata:
        parsed.append(file.location)
        return parse(file, encoding)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counted))
    config = config_for(tmp_path, keep=2)
    for n in range(1, 5):
        parsed.clear()
        publish(config, tmp_path, n)
        assert len(parsed) == (0 if n == 1 else 1), n  # version 1 creates the table

    catalog = iceberg.open_catalog(config)
    assert isinstance(catalog, ParsingOnce)
    parsed.clear()
    stale = catalog.load_table("db.t")
    again = catalog.load_table("db.t")
    assert len(parsed) == 1 and again.metadata is stale.metadata
    assert again.metadata == parse(stale.io.new_input(stale.metadata_location))

    publish(config, tmp_path, 5)  # another writer (its own catalog) moves the table on
    parsed.clear()
    moved = catalog.load_table("db.t")
    assert parsed == [moved.metadata_location] != [stale.metadata_location]
    assert moved.current_snapshot().summary["tidemark.version"] == "5"  # type: ignore[union-attr,index]

    tdir = str(tmp_path / "lake" / "db" / "t")
    with pytest.raises(CommitFailedException):
        commit_empty(catalog, tdir, 6, "stale", stale)
    entry = commit_empty(catalog, tdir, 6, "current", catalog.load_table("db.t"))
    parsed.clear()
    committed = catalog.load_table("db.t")
    assert parsed == [] and committed.metadata_location == entry["metadata_location"]
    assert committed.metadata == parse(committed.io.new_input(committed.metadata_location))
    fresh = iceberg.open_catalog(config).load_table("db.t")
    assert fresh.metadata == committed.metadata
    assert [s.summary["tidemark.version"] for s in fresh.snapshots() if s.summary][-1] == "6"


def test_a_table_created_with_commit_retries_gets_none_at_its_next_publish(tmp_path: Path) -> None:
    """A table an earlier release created (pyiceberg's default retries) is set to 0 once, in a
    commit of its own, and its next version publishes as before."""
    config = config_for(tmp_path, keep=5)
    publish(config, tmp_path, 1)
    with iceberg.open_catalog(config).load_table("db.t").transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "4"})
    publish(config, tmp_path, 2)
    table = iceberg.open_catalog(config).load_table("db.t")
    assert table.properties["commit.retry.num-retries"] == "0"
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["1", "2"]
    assert by_id(pyiceberg_table(config, "db.t").to_pylist()) == by_id(rows_of(2))


def test_a_stale_writer_of_a_table_with_commit_retries_fails_its_commit(tmp_path: Path) -> None:
    """The property commit of an earlier release's table asserts nothing and refreshes the table:
    a writer holding it as it was before a successor's version must still fail, not land on it."""
    from pyiceberg.exceptions import CommitFailedException

    config = config_for(tmp_path, keep=5)
    publish(config, tmp_path, 1)
    with iceberg.open_catalog(config).load_table("db.t").transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "4"})
    stale = iceberg.open_catalog(config).load_table("db.t")
    publish(config, tmp_path, 2)  # the successor's version
    tdir = str(tmp_path / "lake" / "db" / "t")
    with pytest.raises(CommitFailedException, match="changed since it was loaded"):
        commit_empty(iceberg.open_catalog(config), tdir, 3, "stale", stale)
    table = iceberg.open_catalog(config).load_table("db.t")
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["1", "2"]


def test_pydantic_asks_a_default_factory_its_signature_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic._internal import _fields, _typing_extra

    from orchestrator.lake import iceberg_tx

    asked: list[object] = []
    signature = _typing_extra.signature_no_eval
    monkeypatch.setattr(
        _typing_extra, "signature_no_eval", lambda f: asked.append(f) or signature(f)
    )

    def takes_data(data: dict[str, object]) -> list[object]:
        return []

    iceberg_tx.remember_factory_checks()  # idempotent
    for _ in range(3):
        assert _fields.takes_validated_data_argument(takes_data) is True
        assert _fields.takes_validated_data_argument(dict) is False
    assert asked.count(takes_data) == 1, asked
    assert asked.count(dict) <= 1, asked  # dict: perhaps asked before this test


def test_a_data_file_is_listed_as_pyiceberg_lists_it(tmp_path: Path) -> None:
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from orchestrator.errors import RunFailed
    from orchestrator.lake.iceberg_create import data_file

    config = config_for(tmp_path)
    publish(config, tmp_path, 3)
    table = iceberg.open_catalog(config).load_table("db.t")
    [listed] = iceberg.data_files(table)
    ours = data_file(table.io, table.metadata, listed.file_path)
    theirs = parquet_file_to_data_file(table.io, table.metadata, listed.file_path)
    assert ours == theirs and ours.record_count == 15
    assert (
        ours.lower_bounds and ours.lower_bounds == listed.lower_bounds
    )  # the statistics are there

    other = tmp_path / "other.parquet"  # the same columns, no field IDs
    pq.write_table(
        pq.read_table(listed.file_path.removeprefix("file://"))
        .replace_schema_metadata(None)
        .cast(
            pa.schema(
                [
                    f.remove_metadata()
                    for f in pq.read_schema(listed.file_path.removeprefix("file://"))
                ]
            )
        ),
        other,
    )
    with pytest.raises(RunFailed, match="not the Iceberg table's"):
        data_file(table.io, table.metadata, str(other))


def test_data_file_schemas_load_only_the_tables_the_catalog_has(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    changed = TableInfo(
        "db",
        "t",
        (*TABLE.columns[:2], ColumnInfo("t", "varchar", "varchar(9)", True), TABLE.columns[3]),
        ("id",),
        (),
        0,
    )
    publish(config, tmp_path, 1)  # db.t exists; its column t will be replaced (a new field ID)
    absent = [
        TableInfo("db", "new", TABLE.columns, ("id",), (), 0),
        TableInfo("other", "new", TABLE.columns, ("id",), (), 0),
    ]  # other: no namespace yet
    catalog = iceberg.open_catalog(config)
    loaded: list[object] = []
    load = catalog.load_table
    catalog.load_table = lambda name: loaded.append(name) or load(name)  # type: ignore[method-assign]
    schemas = iceberg.data_file_schemas(config, [changed, *absent], catalog)
    assert loaded == ["db.t"], "only the table the catalog has is loaded"
    assert schemas == {t.name: iceberg.data_file_schema(config, t) for t in (changed, *absent)}
    assert field_ids_of(schemas["db.t"]) == {"id": 1, "d": 2, "t": 5, "big": 4}
    assert field_ids_of(schemas["db.new"]) == {"id": 1, "d": 2, "t": 3, "big": 4}


def field_ids_of(schema: pa.Schema) -> dict[str, int]:
    return {f.name: int(f.metadata[FIELD_ID]) for f in schema}


def test_an_incremental_run_whose_columns_did_not_change_needs_no_catalog(tmp_path: Path) -> None:
    """The published version's newest file gives the field IDs its new files are written with:
    the same schema the Iceberg table gives (`iceberg.data_file_schema`), without opening it."""
    config = config_for(tmp_path)
    publish(config, tmp_path, 1)
    publish(config, tmp_path, 2)
    tdir = str(tmp_path / "lake" / "db" / "t")
    published = published_schema(TABLE.columns)
    found = newest_field_ids(tdir, read_manifest(tdir), published)
    planned = iceberg.data_file_schema(config, TABLE)
    assert found is not None and found == planned
    assert field_ids_of(found) == field_ids_of(planned) == {"id": 1, "d": 2, "t": 3, "big": 4}
    assert [f.nullable for f in found] == [f.nullable for f in published]

    asked: list[str] = []

    def from_iceberg(info: TableInfo) -> Callable[[], pa.Schema]:
        def schema() -> pa.Schema:
            asked.append(info.name)
            return iceberg.data_file_schema(config, info)

        return schema

    # A real incremental reconcile: the updated row's file is rewritten, with the IDs the Iceberg
    # table gives, and the Iceberg table is never asked.
    changes = tmp_path / "changes"
    update_row(changes, {"id": 3, "d": None, "t": 7, "big": "3.00"})
    out = tmp_path / "reconciled"
    rows = reconcile_incremental(
        no_spark, TABLE, ("id",), tdir, str(changes), str(out), schema=from_iceberg(TABLE)
    )
    assert rows == 10 and asked == []
    written = [pq.read_schema(f) for f in out.rglob("*.parquet")]
    assert written and all(field_ids_of(w) == field_ids_of(planned) for w in written)

    retyped = TableInfo(
        "db",
        "t",
        (*TABLE.columns[:2], ColumnInfo("t", "varchar", "varchar(9)", True), TABLE.columns[3]),
        ("id",),
        (),
        0,
    )
    assert newest_field_ids(tdir, read_manifest(tdir), published_schema(retyped.columns)) is None
    for info, asks in ((TABLE, []), (retyped, ["db.t"])):
        asked.clear()
        target = Target(info, ("id",), from_iceberg(info), str(out))
        schema = published_ids_first(target, tdir, read_manifest(tdir)).schema
        assert asked == asks, "a column changed: the Iceberg table gives the IDs"
        assert field_ids_of(schema) == (
            {"id": 1, "d": 2, "t": 5, "big": 4} if asks else field_ids_of(planned)
        )


def update_row(directory: Path, row: dict[str, object]) -> None:
    """A change segment updating one row of `TABLE` (its key unchanged), as capture writes it."""
    directory.mkdir()
    fields = [pa.field(n, pa.int64()) for n in ("_tm_file", "_tm_pos", "_tm_row")]
    fields += [pa.field("_tm_op", pa.string()), *staging_schema(TABLE.columns)]
    fields.append(pa.field("_tm_old_id", pa.int64()))
    values = {"_tm_file": 1, "_tm_pos": 10, "_tm_row": 0, "_tm_op": "U", **row}
    segment = pa.Table.from_pylist([{**values, "_tm_old_id": row["id"]}], pa.schema(fields))
    pq.write_table(segment, directory / "seg-000000.parquet")


def no_spark() -> SparkSession:
    raise AssertionError("a small incremental reconcile needs no Spark")


def test_the_newest_file_of_the_version_gives_the_field_ids(tmp_path: Path) -> None:
    """The file of the highest version the manifest lists, wherever it is in the list; a file
    without field IDs, or of other columns, gives none."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    data = tmp_path / "data"
    data.mkdir()
    files = {
        "data/v000001-aa-c0000.parquet": {"id": 1, "v": 2},
        "data/v000003-cc-c0000.parquet": {"id": 1, "v": 7},
        "data/v000002-bb-c0000.parquet": {"id": 1, "v": 5},
    }
    for name, ids in files.items():
        pq.write_table(schema.empty_table().cast(with_field_ids(schema, ids)), tmp_path / name)
    listed = cast(Manifest, {"files": list(files)})
    found = newest_field_ids(str(tmp_path), listed, schema)
    assert found is not None and field_ids_of(found) == {"id": 1, "v": 7}
    pq.write_table(schema.empty_table(), data / "v000004-dd-c0000.parquet")
    newer = cast(Manifest, {"files": [*files, "data/v000004-dd-c0000.parquet"]})
    assert newest_field_ids(str(tmp_path), newer, schema) is None
    widened = pa.schema([schema.field("id").with_type(pa.decimal128(20, 0)), schema.field("v")])
    assert newest_field_ids(str(tmp_path), listed, widened) is None
    assert newest_field_ids(str(tmp_path), cast(Manifest, {"files": []}), schema) is None


def test_a_tagged_snapshot_is_kept_by_retention(tmp_path: Path) -> None:
    """A tag (or branch) a user put on a version's snapshot keeps it, and its files, past
    keep_versions; publishing goes on (expiring it failed every later publish of the table)."""
    config = config_for(tmp_path, keep=1)
    publish(config, tmp_path, 1)
    table = iceberg.open_catalog(config).load_table("db.t")
    tagged = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    table.manage_snapshots().create_tag(tagged, "audit").commit()
    for n in (2, 3):
        assert publish(config, tmp_path, n)["version"] == n
    table = iceberg.open_catalog(config).load_table("db.t")
    assert [s.summary["tidemark.version"] for s in table.snapshots() if s.summary] == ["1", "3"]
    assert by_id(table.scan(snapshot_id=tagged).to_arrow().to_pylist()) == by_id(rows_of(1))
