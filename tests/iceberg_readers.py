"""Reading a published table as an Iceberg reader would: pyiceberg through the catalog, and
DuckDB's ``iceberg_scan`` on the metadata file ``current.json`` names (no catalog).

DuckDB cannot download extensions here: they are loaded from the files of the PyPI packages
``duckdb-extension-iceberg`` / ``-avro`` / ``-parquet``, pinned to the installed ``duckdb``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.app.demo.sample import connect
from orchestrator.app.demo.verify import compare, published_rows, source_rows
from orchestrator.config import PipelineConfig
from orchestrator.lake.iceberg import open_catalog
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import table_dir
from orchestrator.source.connection import Source


def extension_file(name: str) -> str:
    """The ``.duckdb_extension`` file inside the installed ``duckdb_extension_<name>`` package."""
    spec = importlib.util.find_spec(f"duckdb_extension_{name}")
    assert spec is not None and spec.submodule_search_locations, (
        f"pip install duckdb-extension-{name}"
    )
    found = sorted(
        Path(next(iter(spec.submodule_search_locations))).rglob(f"{name}.duckdb_extension")
    )
    assert found, f"duckdb_extension_{name} holds no {name}.duckdb_extension"
    return str(found[-1])


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for name in ("parquet", "avro", "iceberg"):
        con.execute(f"LOAD '{extension_file(name)}'")
    return con


def duckdb_table(tdir: str) -> pa.Table:
    """The current version through ``iceberg_scan(<metadata_location>)``."""
    location = read_manifest(tdir)["iceberg"]["metadata_location"]
    con = duckdb_connection()
    try:
        return con.execute("SELECT * FROM iceberg_scan(?)", [location]).fetch_arrow_table()
    finally:
        con.close()


def pyiceberg_table(config: PipelineConfig, table: str) -> pa.Table:
    """The current snapshot through the configured catalog."""
    return open_catalog(config).load_table(table).scan().to_arrow()


def field_ids(parquet_file: str) -> dict[str, int]:
    """Column name -> the Parquet field ID a data file carries."""
    schema = pq.read_schema(parquet_file)
    return {f.name: int(json.loads((f.metadata or {})[b"PARQUET:field_id"])) for f in schema}


def assert_readers_equal_source(config: PipelineConfig, tables: list[str]) -> None:
    """Each table read through its manifest, through pyiceberg (catalog) and through DuckDB's
    ``iceberg_scan`` (the metadata file ``current.json`` names) equals its source, row for row."""
    with Source.from_pipeline(config) as source:
        conn = connect(config.source.host, config.source.port, "root", "")
        try:
            for name in tables:
                info = source.table_info(name)
                tdir = table_dir(config, name)
                expected = source_rows(conn, info)
                assert expected, (
                    f"{name}: the source table is empty, so the comparison would prove nothing"
                )
                readers = {
                    "manifest": published_rows(tdir),
                    "pyiceberg": pyiceberg_table(config, name).to_pylist(),
                    "duckdb": duckdb_table(tdir).to_pylist(),
                }
                for reader, rows in readers.items():
                    result = compare(info, info.primary_key, expected, rows)
                    assert result.equal, f"{name} through {reader}: {result.summary()}"
                assert (
                    open_catalog(config).load_table(name).metadata_location
                    == read_manifest(tdir)["iceberg"]["metadata_location"]
                )
        finally:
            conn.close()
