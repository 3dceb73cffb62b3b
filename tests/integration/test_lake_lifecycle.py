"""A table's life in the lake across plain `tidemark run`s: runs that find no change publish
nothing but move the recorded position; a source change Iceberg cannot evolve starts a new
Iceberg table generation. Real MariaDB, local Spark, read back through the manifest, pyiceberg
and DuckDB (tests/iceberg_readers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.app.status import status_command
from orchestrator.config import PipelineConfig
from orchestrator.lake.iceberg import open_catalog
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.positions import BinlogPosition
from tests.conftest import fresh_database, load_pipeline
from tests.iceberg_readers import assert_readers_equal_source

pytestmark = pytest.mark.integration


def run(config: PipelineConfig) -> None:
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0


def checked_position(config: PipelineConfig, table: str) -> tuple[int, BinlogPosition]:
    """The version and position the state store records for ``table``."""
    store = open_store(config)
    try:
        checkpoint = store.table_checkpoint(config.pipeline, table)
    finally:
        store.close()
    assert checkpoint is not None
    return checkpoint.version, BinlogPosition.from_json(checkpoint.position)


def snapshot_ids(config: PipelineConfig, table: str) -> list[int]:
    return [s.snapshot_id for s in open_catalog(config).load_table(table).snapshots()]


def test_a_run_without_changes_moves_the_position_and_publishes_nothing(
    mariadb: LocalMariaDB, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "lake_quiet"
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE quiet (id INT PRIMARY KEY, v VARCHAR(20))",
        "CREATE TABLE busy (id INT PRIMARY KEY, n INT)",
        "INSERT INTO quiet SELECT seq, CONCAT('q', seq) FROM seq_1_to_300",
        "INSERT INTO busy SELECT seq, seq FROM seq_1_to_300",
        database=db,
    )
    quiet, busy = f"{db}.quiet", f"{db}.busy"
    config = load_pipeline(tmp_path, mariadb, [{"name": quiet}, {"name": busy}], name="quiet")
    run(config)
    current = Path(table_dir(config, quiet)) / "_tidemark" / "current.json"
    first, first_snapshots = current.read_bytes(), snapshot_ids(config, quiet)
    version, first_position = checked_position(config, quiet)
    assert version == 1 and len(first_snapshots) == 1

    mariadb.execute("UPDATE busy SET n = -n WHERE id <= 10", database=db)  # the binlog moves on
    run(config)

    assert current.read_bytes() == first, "current.json (and so its Iceberg snapshot) is unchanged"
    assert snapshot_ids(config, quiet) == first_snapshots, "no new Iceberg snapshot"
    assert [p.name for p in (current.parent / "versions").iterdir()] == ["000001.json"]
    version, position = checked_position(config, quiet)
    assert version == 1 and position > first_position, (
        "the state store records the position checked"
    )
    assert checked_position(config, busy)[0] == 2 and checked_position(config, busy)[1] == position
    capsys.readouterr()
    assert status_command(config) == 0
    published = capsys.readouterr().out.split("published:", 1)[1]
    line = next(x for x in published.splitlines() if x.strip().startswith(quiet))
    assert f"at {position}" in line and "v1 " in line, line
    assert (
        f"(version 1 is at {first_position.file}:{first_position.pos}; no change since)" in line
    ), line
    assert_readers_equal_source(config, [quiet, busy])

    mariadb.execute(
        "UPDATE quiet SET v = 'changed' WHERE id BETWEEN 5 AND 9",
        "DELETE FROM quiet WHERE id = 300",
        "INSERT INTO quiet VALUES (301, 'new')",
        database=db,
    )
    run(config)

    manifest = read_manifest(table_dir(config, quiet))
    assert manifest["version"] == 2 and checked_position(config, quiet)[0] == 2
    assert (
        BinlogPosition.from_json(dict(manifest["position"])) == checked_position(config, quiet)[1]
    )
    ids = snapshot_ids(config, quiet)
    assert (
        ids[:1] == first_snapshots
        and len(ids) == 2
        and manifest["iceberg"]["snapshot_id"] == ids[-1]
    )
    assert_readers_equal_source(config, [quiet, busy])


def published_once(
    mariadb: LocalMariaDB, tmp_path: Path, name: str, columns: str, rows: str
) -> tuple[PipelineConfig, str]:
    """A new database and table ``name`` (``columns``, filled by the SELECT ``rows``), the only
    table of a pipeline whose first run has published it."""
    db, table = name.split(".")
    fresh_database(mariadb, db, f"CREATE TABLE {table} ({columns})", f"INSERT INTO {table} {rows}")
    config = load_pipeline(tmp_path, mariadb, [{"name": name}], name=db)
    run(config)
    return config, name


def field_ids(config: PipelineConfig, name: str) -> dict[str, int]:
    """The Iceberg table's field IDs by column, in the schema's order."""
    return {f.name: f.field_id for f in open_catalog(config).load_table(name).schema().fields}


def test_a_column_type_iceberg_cannot_evolve_becomes_a_new_column(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """INT -> VARCHAR and BIGINT -> INT between runs: the run re-reads the table, the Iceberg
    columns are replaced (new field IDs, the others kept), and every reader reads the source."""
    db = "lake_retype"
    config, name = published_once(
        mariadb,
        tmp_path,
        f"{db}.shape",
        "id INT PRIMARY KEY, n INT, b BIGINT, v VARCHAR(10)",
        "SELECT seq, seq, seq * 1000, CONCAT('v', seq) FROM seq_1_to_200",
    )
    before = field_ids(config, name)
    first = read_manifest(table_dir(config, name))["iceberg"]

    mariadb.execute(
        "ALTER TABLE shape MODIFY n VARCHAR(20), MODIFY b INT",
        "UPDATE shape SET n = CONCAT('n-', id) WHERE id <= 20",
        database=db,
    )
    run(config)

    table = open_catalog(config).load_table(name)
    after = {f.name: (f.field_id, str(f.field_type)) for f in table.schema().fields}
    assert after["id"] == (before["id"], "int") and after["v"] == (before["v"], "string")
    assert after["n"][1] == "string" and after["b"][1] == "int"
    assert {after["n"][0], after["b"][0]}.isdisjoint(before.values()), (
        "replaced columns get new IDs"
    )
    assert list(after) == ["id", "n", "b", "v"], "replaced columns keep their place"
    assert read_manifest(table_dir(config, name))["version"] == 2
    assert_readers_equal_source(config, [name])
    old = table.scan(snapshot_id=first["snapshot_id"]).to_arrow()
    assert old.num_rows == 200 and str(old.schema.field("n").type) == "int32", (
        "the old snapshot keeps its schema"
    )


def test_the_iceberg_columns_follow_the_source_order(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """Columns added FIRST and AFTER another, and a column moved, between runs (each with row
    changes): the Iceberg schema lists the columns in the source's order, the existing columns
    keep their field IDs, and every reader reads the source."""
    db = "lake_order"
    config, name = published_once(
        mariadb,
        tmp_path,
        f"{db}.cols",
        "id INT PRIMARY KEY, a INT, b VARCHAR(10)",
        "SELECT seq, seq, CONCAT('b', seq) FROM seq_1_to_200",
    )
    before = field_ids(config, name)

    def columns() -> list[str]:
        return list(field_ids(config, name))

    mariadb.execute(
        "ALTER TABLE cols ADD COLUMN z INT FIRST, ADD COLUMN m VARCHAR(5) AFTER a",
        "UPDATE cols SET z = id * 2, m = 'm' WHERE id <= 50",
        database=db,
    )
    run(config)
    assert columns() == ["z", "id", "a", "m", "b"]
    assert_readers_equal_source(config, [name])

    mariadb.execute(
        "ALTER TABLE cols MODIFY b VARCHAR(10) AFTER id",
        "UPDATE cols SET a = -a WHERE id > 150",
        database=db,
    )
    run(config)
    assert columns() == ["z", "id", "b", "a", "m"]
    after = field_ids(config, name)
    assert {k: after[k] for k in before} == before, (
        "the columns that were there keep their field IDs"
    )
    assert_readers_equal_source(config, [name])


def test_text_to_binary_and_back_replaces_the_column(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """VARCHAR -> VARBINARY on one table, VARBINARY -> VARCHAR on another, with row changes, between
    runs: pyiceberg's promote() accepts string <-> binary but a schema update does not carry it
    out, so the column is replaced like any change Iceberg cannot promote, and the re-read
    publishes the new type (every run failed at publish, the field kept its old type)."""
    db = "lake_bytes"
    fresh_database(
        mariadb,
        db,
        "CREATE TABLE to_bin (id INT PRIMARY KEY, v VARCHAR(40), n INT)",
        "INSERT INTO to_bin SELECT seq, CONCAT('row ', seq), seq FROM seq_1_to_300",
        "CREATE TABLE to_text (id INT PRIMARY KEY, v VARBINARY(40), n INT)",
        "INSERT INTO to_text SELECT seq, CONCAT('row ', seq), seq FROM seq_1_to_300",
    )
    names = [f"{db}.to_bin", f"{db}.to_text"]
    config = load_pipeline(tmp_path, mariadb, [{"name": name} for name in names], name="bytes")
    run(config)
    before = {
        name: open_catalog(config).load_table(name).schema().find_field("v").field_id
        for name in names
    }

    mariadb.execute(
        "ALTER TABLE to_bin MODIFY v VARBINARY(40)",
        "ALTER TABLE to_text MODIFY v VARCHAR(40)",
        "UPDATE to_bin SET v = UNHEX('00ff10') WHERE id <= 5",
        "DELETE FROM to_bin WHERE id = 9",
        "UPDATE to_text SET v = 'changed' WHERE id <= 5",
        "INSERT INTO to_text VALUES (400, 'new', 1)",
        database=db,
    )
    run(config)

    for name, wanted in zip(names, ("binary", "string"), strict=True):
        field = open_catalog(config).load_table(name).schema().find_field("v")
        assert str(field.field_type) == wanted and field.field_id != before[name], (name, field)
        assert read_manifest(table_dir(config, name))["version"] == 2
    assert_readers_equal_source(config, names)
    mariadb.execute(
        "UPDATE to_bin SET v = UNHEX('0102') WHERE id = 10",
        "DELETE FROM to_text WHERE id = 1",
        database=db,
    )
    run(config)  # and changes are applied to the new column
    assert_readers_equal_source(config, names)
