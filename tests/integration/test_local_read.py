"""Small tables read by the driver (`orchestrator.pipeline.read.local`) write the files a Spark job
writes: every type of the type mapping, value for value, the same schema and field IDs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.errors import RunFailed
from orchestrator.lake import iceberg
from orchestrator.pipeline.read.jdbc import read_chunks
from orchestrator.pipeline.read.local import BATCH_ROWS, LocalTable, read_table, read_tables
from orchestrator.pipeline.read.step import _ChunkPaths
from orchestrator.pipeline.reconcile.rewrite import chunk_base
from orchestrator.schema.tables import TableInfo
from orchestrator.source.connection import Source
from orchestrator.state.records import ChunkRecord
from tests.conftest import fresh_database
from tests.integration.test_read import EXPLICIT, ROWS, _config, reader, types_table  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

CHUNKS = [(0, "`id` < 3"), (1, "`id` >= 3"), (2, "FALSE")]


def _file(directory: Path) -> Path:
    (only,) = sorted(directory.glob("*.parquet"))
    return only


def _local(
    info: TableInfo, schema: Any, root: Path, chunks: list[tuple[int, str]] = CHUNKS
) -> LocalTable:
    return LocalTable(
        info, ("id",), schema, [(i, where, str(root / f"c{i}.parquet")) for i, where in chunks]
    )


def test_the_driver_writes_what_a_spark_job_writes(
    spark: Any,
    mariadb: LocalMariaDB,
    types_table: TableInfo,  # noqa: F811
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, mariadb)
    schema = iceberg.data_file_schema(config, types_table)
    by_spark, by_driver = tmp_path / "spark", tmp_path / "driver"
    read_chunks(
        spark,
        config,
        types_table,
        CHUNKS,
        lambda i: str(by_spark / f"c{i}"),
        ("id",),
        schema=schema,
    )
    with Source.from_pipeline(config) as source:
        done = read_table(source, _local(types_table, schema, by_driver), lambda: None)

    assert [written["rows"] for written in done] == [2, ROWS - 2, 0]
    # What the read records of each file is what reconcile finds by opening it (`chunk_base`), and
    # the key ranges are those of the file Spark wrote.
    files = [
        str(by_driver / f"c{i}.parquet") for i, _ in CHUNKS
    ]  # a driver's chunk is its one file
    assert [written["file"] for written in done] == files
    recorded = {f: [written] for f, written in zip(files, done, strict=True)}
    opened = chunk_base(files, ("id",), types_table.name)
    assert opened is not None and chunk_base(files, ("id",), types_table.name, recorded) == opened
    assert [entry["file"] for _, entry in opened] == [w["file"] for w in done if w["rows"]]
    by_files = chunk_base([str(by_spark / f"c{i}") for i, _ in CHUNKS], ("id",), types_table.name)
    assert by_files is not None
    assert [(e["min_key"], e["max_key"], e["rows"]) for _, e in by_files] == [
        (w["min_key"], w["max_key"], w["rows"]) for w in done if w["rows"]
    ]
    for i, _ in CHUNKS:
        spark_file, driver_file = _file(by_spark / f"c{i}"), by_driver / f"c{i}.parquet"
        # types, nullability and field IDs alike (the file's own metadata says who wrote it)
        assert (
            pq.read_schema(driver_file)
            .remove_metadata()
            .equals(pq.read_schema(spark_file).remove_metadata(), check_metadata=True)
        )
        assert pq.read_table(driver_file).equals(pq.read_table(spark_file)), i
    rows = {
        r["id"]: r
        for i, _ in CHUNKS
        for r in pq.read_table(by_driver / f"c{i}.parquet").to_pylist()
    }
    for (name, row_id), value in EXPLICIT.items():  # stated independently of either engine
        assert rows[row_id][name] == value, (name, row_id)


def test_rows_are_in_the_files_order_not_the_servers(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """A text key is sorted by its UTF-8 bytes (Spark's order, the layout's), not by the
    collation."""
    fresh_database(
        mariadb,
        "loc_order",
        "CREATE TABLE loc_order.t (k VARCHAR(8) PRIMARY KEY, v INT) COLLATE utf8mb4_general_ci",
        "INSERT INTO loc_order.t VALUES ('b', 1), ('A', 2), ('é', 3), ('c', 4), ('Z', 5)",
    )
    config = _config(tmp_path, mariadb, user="root", password="")
    with Source.from_pipeline(config) as source:
        info = source.table_info("loc_order.t")
        schema = iceberg.data_file_schema(config, info)
        read_table(
            source,
            LocalTable(info, ("k",), schema, [(0, "TRUE", str(tmp_path / "c0.parquet"))]),
            lambda: None,
        )
    assert pq.read_table(tmp_path / "c0.parquet").column("k").to_pylist() == [
        "A",
        "Z",
        "b",
        "c",
        "é",
    ]


def test_a_null_in_a_not_null_column_fails_the_table(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """As the Spark job: the table fails naming the column, and no file is written."""
    fresh_database(
        mariadb,
        "loc_null",
        "CREATE TABLE loc_null.t (id INT PRIMARY KEY, d DATE NOT NULL)",
        "SET SESSION sql_mode = ''",
        "INSERT INTO loc_null.t VALUES (1, '0000-00-00')",
    )
    config = _config(tmp_path, mariadb, user="root", password="")
    with Source.from_pipeline(config) as source:
        info = source.table_info("loc_null.t")
        schema = iceberg.data_file_schema(config, info)
    required = schema.set(
        1, schema.field(1).with_nullable(False)
    )  # as if the zero date could not occur
    out = read_tables(
        config,
        [LocalTable(info, ("id",), required, [(0, "TRUE", str(tmp_path / "c0.parquet"))])],
        lambda: None,
    )
    failure = out["loc_null.t"]
    assert isinstance(failure, RunFailed) and "NULL read from NOT NULL column d" in str(failure)
    assert not (tmp_path / "c0.parquet").exists()


def test_an_sql_error_is_the_tables_own_failure(mariadb: LocalMariaDB, tmp_path: Path) -> None:
    """One table's failing statement fails that table only; the others of the batch are read."""
    fresh_database(
        mariadb,
        "loc_err",
        "CREATE TABLE loc_err.a (id INT PRIMARY KEY)",
        "CREATE TABLE loc_err.b (id INT PRIMARY KEY)",
        "CREATE TABLE loc_err.c (id INT PRIMARY KEY)",
        "INSERT INTO loc_err.a VALUES (1), (2)",
        "INSERT INTO loc_err.c VALUES (3)",
    )
    config = _config(tmp_path, mariadb, user="root", password="")
    with Source.from_pipeline(config) as source:
        infos = [source.table_info(f"loc_err.{t}") for t in "abc"]
    schema = iceberg.data_file_schema(config, infos[0])
    wheres = {"loc_err.a": "TRUE", "loc_err.b": "no_such_column = 1", "loc_err.c": "TRUE"}
    out = read_tables(
        config,
        [
            LocalTable(
                i, ("id",), schema, [(0, wheres[i.name], str(tmp_path / f"{i.table}.parquet"))]
            )
            for i in infos
        ],
        lambda: None,
    )
    failure = out["loc_err.b"]
    assert isinstance(failure, RunFailed) and "read of loc_err.b chunk 0 failed" in str(failure)
    assert "no_such_column" in str(failure)
    assert [(w["rows"], w["bytes"]) for w in out["loc_err.a"]] == [
        (2, (tmp_path / "a.parquet").stat().st_size)
    ]
    assert [(w["rows"], w["bytes"]) for w in out["loc_err.c"]] == [
        (1, (tmp_path / "c.parquet").stat().st_size)
    ]


def test_a_chunk_of_several_batches_streams_into_one_file(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Rows come `BATCH_ROWS` at a time (memory holds one batch of Python values); the file is
    the one Spark writes."""
    rows = 2 * BATCH_ROWS + 123
    fresh_database(
        mariadb,
        "loc_many",
        "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), f FLOAT, d DATETIME(6))",
        f"INSERT INTO t SELECT seq, CONCAT('v', seq % 977), seq / 7, "
        f"'2024-01-01' + INTERVAL seq SECOND FROM seq_1_to_{rows}",
    )
    config = _config(tmp_path, mariadb, user="root", password="")
    with Source.from_pipeline(config) as source:
        info = source.table_info("loc_many.t")
        schema = iceberg.data_file_schema(config, info)
        (done,) = read_table(
            source,
            LocalTable(info, ("id",), schema, [(0, "TRUE", str(tmp_path / "driver.parquet"))]),
            lambda: None,
        )
    read_chunks(
        spark,
        config,
        info,
        [(0, "TRUE")],
        lambda _: str(tmp_path / "spark"),
        ("id",),
        schema=schema,
    )
    assert done["rows"] == rows
    assert pq.read_table(tmp_path / "driver.parquet").equals(
        pq.read_table(_file(tmp_path / "spark"))
    )


def test_a_driver_chunk_file_is_one_spark_reads(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Spark leaves out files whose name starts with ``_`` or ``.``, even named one by one (a
    rewrite or a mixed snapshot reads chunk files with Spark): the driver's chunk file of a table
    in database ``_ops`` is named so Spark reads its rows."""
    config = _config(tmp_path, mariadb)
    path = Path(
        _ChunkPaths(config, "run-1", "0a1b2c3d").file_of(
            "_ops.sessions",
            ChunkRecord(
                "run-1",
                "_ops.sessions",
                3,
                0,
                None,
                None,
                "TRUE",
                "pending",
                None,
                None,
                None,
                None,
                None,
                0,
            ),
        )
    )
    assert path.parent == Path(config.staging_path) / "run-1" / "snapshot"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": [1, 2, 3]}), path)
    assert spark.read.parquet(str(path)).count() == 3
