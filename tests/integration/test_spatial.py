"""Spatial columns (docs/types.md): every spatial type is published as OGC WKB, with the SRID
its column declares in the manifest's column and the Iceberg field's doc; the bytes are the same
whether the row was read by Spark, by the driver or applied from the binlog, and DuckDB's spatial
extension reads them back as the geometries the source's ``ST_AsText`` prints. A value of
another SRID than its column declares (MariaDB does not enforce ``REF_SYSTEM_ID``) fails its
table, naming the column, on every path.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig
from orchestrator.lake.iceberg import open_catalog
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.failed import TablesFailed
from tests.conftest import fresh_database
from tests.iceberg_readers import assert_readers_equal_source, extension_file, pyiceberg_table
from tests.integration.conftest import both_readers, run_plain

pytestmark = pytest.mark.integration

DB = "geo_types"
COLUMNS = {
    "g": "GEOMETRY",
    "p": "POINT REF_SYSTEM_ID=4326",
    "l": "LINESTRING",
    "pg": "POLYGON",
    "mp": "MULTIPOINT",
    "ml": "MULTILINESTRING",
    "mpg": "MULTIPOLYGON",
    "gc": "GEOMETRYCOLLECTION NOT NULL",
}
#: Rows as WKT per column (None: NULL); `p` is SRID 4326, every other value SRID 0.
ROWS = [
    {
        "g": "POINT(1.5 -2.25)",
        "p": "POINT(13.4 52.52)",
        "l": "LINESTRING(0 0,1 1,2 0.5)",
        "pg": "POLYGON((0 0,4 0,4 4,0 4,0 0),(1 1,2 1,2 2,1 1))",
        "mp": "MULTIPOINT(1 1,2 2)",
        "ml": "MULTILINESTRING((0 0,1 1),(2 2,3 3,4 2))",
        "mpg": "MULTIPOLYGON(((0 0,1 0,1 1,0 0)),((5 5,6 5,6 6,5 5)))",
        "gc": "GEOMETRYCOLLECTION(POINT(1 1),LINESTRING(0 0,1 1))",
    },
    {
        "g": "POLYGON((0 0,1e-7 0,0 1e-7,0 0))",
        "p": None,
        "l": None,
        "pg": None,
        "mp": None,
        "ml": None,
        "mpg": None,
        "gc": "GEOMETRYCOLLECTION EMPTY",
    },
    {
        "g": None,
        "p": "POINT(-180 -90)",
        "l": "LINESTRING(1e300 -1e300,0 0)",
        "pg": "POLYGON((10 10,20 10,20 20,10 10))",
        "mp": "MULTIPOINT(0 0)",
        "ml": "MULTILINESTRING((0 0,0 1))",
        "mpg": "MULTIPOLYGON(((0 0,2 0,2 2,0 0)))",
        "gc": "GEOMETRYCOLLECTION(POLYGON((0 0,1 0,1 1,0 0)),POINT(3 4))",
    },
]


def _literal(column: str, wkt: str | None) -> str:
    if wkt is None:
        return "NULL"
    return f"ST_GeomFromText('{wkt}', {4326 if column == 'p' else 0})"


def insert(table: str, first_id: int) -> str:
    values = ", ".join(
        "(" + ", ".join([str(first_id + n), *(_literal(c, row[c]) for c in COLUMNS)]) + ")"
        for n, row in enumerate(ROWS)
    )
    return f"INSERT INTO {table} (id, {', '.join(COLUMNS)}) VALUES {values}"


def create(mariadb: LocalMariaDB, db: str, *tables: str) -> None:
    fresh_database(mariadb, db)
    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
    for table in tables:
        mariadb.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, {columns})", database=db)


def source_text(mariadb: LocalMariaDB, table: str) -> dict[int, tuple[str | None, ...]]:
    """``{id: (ST_AsText of each column...)}`` as the source prints them."""
    listed = ", ".join(f"ST_AsText({c})" for c in COLUMNS)
    rows = mariadb.execute(f"SELECT id, {listed} FROM {table}")
    return {int(r[0]): tuple(None if v is None else str(v) for v in r[1:]) for r in rows}


def duckdb_text(
    con: duckdb.DuckDBPyConnection, rows: list[dict[str, object]]
) -> dict[int, tuple[str | None, ...]]:
    """The lake's WKB through DuckDB's ``ST_GeomFromWKB``, as DuckDB prints each geometry."""
    out = {}
    for row in rows:
        texts = []
        for c in COLUMNS:
            value = row[c]
            found = con.execute("SELECT ST_AsText(ST_GeomFromWKB(?))", [value]).fetchone()
            texts.append(None if value is None or found is None else str(found[0]))
        out[int(str(row["id"]))] = tuple(texts)
    return out


def as_duckdb_prints(
    con: duckdb.DuckDBPyConnection, expected: dict[int, tuple[str | None, ...]]
) -> dict[int, tuple[str | None, ...]]:
    """The source's WKT as DuckDB prints the same geometry (its own spacing)."""
    printed = {}
    for key, texts in expected.items():
        printed[key] = tuple(
            None
            if text is None
            else str(con.execute("SELECT ST_AsText(ST_GeomFromText(?))", [text]).fetchone()[0])  # type: ignore[index]
            for text in texts
        )
    return printed


def test_spatial_values_are_wkb_the_same_on_every_path(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    create(mariadb, DB, "spark", "driver")
    for table in ("spark", "driver"):
        mariadb.execute(insert(table, 1), database=DB)
    config = both_readers(tmp_path, mariadb, DB)
    run_plain(config)
    for table in ("spark", "driver"):  # the same rows again, and a changed one, by the binlog
        mariadb.execute(
            insert(table, 11),
            f"UPDATE {table} SET g = ST_GeomFromText('LINESTRING(7 7,8 8)', 0) WHERE id = 3",
            database=DB,
        )
    run_plain(config)

    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{extension_file('spatial')}'")
        for table in ("spark", "driver"):
            name = f"{DB}.{table}"
            rows = pyiceberg_table(config, name).to_pylist()
            by_id = {r["id"]: r for r in rows}
            assert len(by_id) == 2 * len(ROWS)
            for n in range(1, len(ROWS) + 1):  # read by the snapshot == applied from the binlog
                if n == 3:
                    continue
                assert by_id[n] | {"id": 0} == by_id[n + 10] | {"id": 0}, (name, n)
            assert duckdb_text(con, rows) == as_duckdb_prints(
                con, source_text(mariadb, f"{DB}.{table}")
            ), name
            point = bytes(by_id[1]["p"])  # OGC WKB: byte order, type 1, x, y; no SRID prefix
            assert len(point) == 21 and point[:5] == bytes.fromhex("0101000000"), point.hex()
        spark_rows = {r["id"]: r for r in pyiceberg_table(config, f"{DB}.spark").to_pylist()}
        driver_rows = {r["id"]: r for r in pyiceberg_table(config, f"{DB}.driver").to_pylist()}
        assert spark_rows == driver_rows  # Spark's read and the driver's write the same bytes
    finally:
        con.close()
    assert_readers_equal_source(config, [f"{DB}.spark", f"{DB}.driver"])

    # The SRID: in the manifest's column and in the Iceberg field's doc.
    columns = {c["name"]: c for c in read_manifest(table_dir(config, f"{DB}.spark"))["columns"]}
    assert columns["p"]["srid"] == 4326 and columns["g"]["srid"] == 0
    assert "srid" not in columns["id"]
    fields = {f.name: f for f in open_catalog(config).load_table(f"{DB}.spark").schema().fields}
    assert fields["p"].doc == "OGC WKB; SRID 4326 (MySQL point)"
    assert fields["gc"].doc == "OGC WKB; SRID 0 (MySQL geometrycollection)"
    assert str(fields["p"].field_type) == "binary"


#: A POINT of the column's SRID, one of SRID 0 (which MariaDB stores all the same), and an empty
#: collection for the table's other spatial column: the SRID tests' values.
SRID_POINTS = (
    "ST_GeomFromText('POINT(1 1)', 4326)",
    "ST_GeomFromText('POINT(1 1)', 0)",
    "ST_GeomFromText('GEOMETRYCOLLECTION EMPTY')",
)


def _failures(config: PipelineConfig, *tables: str) -> dict[str, dict[str, str]]:
    """Run once: the run ends partial, with ``tables`` alone failed; their failures."""
    with pytest.raises(TablesFailed) as partial:
        run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False)
    assert set(partial.value.failed) == set(tables), partial.value.failed
    return dict(partial.value.failed)


def test_a_value_of_another_srid_than_its_column_declares_fails_its_table(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """MariaDB stores a POINT of SRID 0 in a column declaring 4326: published under the column's
    SRID it would be wrong. The table fails naming the column, the SRIDs and the fix; read by
    Spark, by the driver, and from the binlog alike."""
    db = "geo_srid"
    create(mariadb, db, "spark", "driver")
    good, bad, gc = SRID_POINTS
    mariadb.execute(
        *(f"INSERT INTO spark (id, p, gc) VALUES ({n}, {good}, {gc})" for n in range(1, 6)),
        f"INSERT INTO spark (id, p, gc) VALUES (6, {bad}, {gc})",
        f"INSERT INTO driver (id, p, gc) VALUES (1, {good}, {gc}), (2, {bad}, {gc})",
        database=db,
    )
    config = both_readers(tmp_path, mariadb, db)
    failed = _failures(config, f"{db}.spark", f"{db}.driver")
    assert {f["step"] for f in failed.values()} == {"read"}, failed
    reasons = {table: failure["reason"] for table, failure in failed.items()}
    declared = "but the column declares SRID 4326"
    assert f"column `p` holds a value of another SRID, {declared}" in reasons[f"{db}.spark"]
    assert f"column `p` holds a value of SRID 0, {declared}" in reasons[f"{db}.driver"]
    assert "ST_GeomFromWKB(ST_AsBinary(`p`), 4326)" in reasons[f"{db}.driver"]

    mariadb.execute(
        "DELETE FROM spark WHERE id = 6", "DELETE FROM driver WHERE id = 2", database=db
    )
    run_plain(config)  # both published; now a bad value through the binlog
    mariadb.execute(f"UPDATE driver SET p = {bad} WHERE id = 1", database=db)
    failure = _failures(config, f"{db}.driver")[f"{db}.driver"]
    assert failure["step"] == "capture", failure
    assert f"column `p` holds a value of SRID 0, {declared}" in failure["reason"], failure


def test_a_table_failed_in_capture_stays_failed_with_a_prepared_xa_transaction(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """A table whose capture failed keeps no rows after the failure; an XA transaction with rows
    of it, prepared but not committed at ``H``, must not make it a table to publish again (its
    next start is held for that transaction, its status stays failed)."""
    db = "geo_srid_xa"
    create(mariadb, db, "spark", "driver")
    good, bad, gc = SRID_POINTS
    mariadb.execute(
        *(f"INSERT INTO {t} (id, p, gc) VALUES (1, {good}, {gc})" for t in ("spark", "driver")),
        database=db,
    )
    config = both_readers(tmp_path, mariadb, db)
    run_plain(config)
    mariadb.execute(
        f"UPDATE driver SET p = {bad} WHERE id = 1",
        f"INSERT INTO driver (id, p, gc) VALUES (2, {good}, {gc})",
        database=db,
    )
    mariadb.execute(
        "XA START 'geo'",
        f"INSERT INTO {db}.driver (id, p, gc) VALUES (3, {good}, {gc})",
        "XA END 'geo'",
        "XA PREPARE 'geo'",
    )
    try:
        failure = _failures(config, f"{db}.driver")[f"{db}.driver"]
    finally:
        mariadb.execute("XA ROLLBACK 'geo'")
    assert failure["step"] == "capture", failure
    published = read_manifest(table_dir(config, f"{db}.driver"))
    assert published is not None and published["rows"] == 1, "the failed table kept its version"
