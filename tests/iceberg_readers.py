"""Reading a published table as an Iceberg reader would: pyiceberg through the catalog, and
DuckDB's ``iceberg_scan`` on the metadata file ``current.json`` names (no catalog); Spark's own
Iceberg runtime too, when a test gives its tables (tests/spark_iceberg.py).

DuckDB cannot download extensions here: they are loaded from the files of the PyPI packages
``duckdb-extension-iceberg`` / ``-avro`` / ``-parquet`` / ``-httpfs`` (a lake on S3), pinned to
the installed ``duckdb``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.app.demo.sample import connect
from orchestrator.app.demo.verify import compare, compare_multisets, published_rows, source_rows
from orchestrator.config import PipelineConfig, S3Config, objectstore
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


def duckdb_connection(s3: S3Config | None = None) -> duckdb.DuckDBPyConnection:
    """DuckDB with its Parquet, Avro and Iceberg extensions; with ``s3``, httpfs and a secret
    of that store (``output.s3``'s endpoint, region, addressing and keys)."""
    con = duckdb.connect()
    for name in ("parquet", "avro", "iceberg", *(("httpfs",) if s3 else ())):
        con.execute(f"LOAD '{extension_file(name)}'")
    if s3 is not None:
        creds = objectstore.credentials(s3)
        options = {"REGION": s3.region, "URL_STYLE": "path" if s3.path_style else "vhost"}
        if s3.endpoint:
            scheme, _, host = s3.endpoint.partition("://")
            options.update(ENDPOINT=host, USE_SSL="true" if scheme == "https" else "false")
        if creds is not None:
            options.update(KEY_ID=creds.access_key, SECRET=creds.secret_key.reveal())
        quoted = ", ".join(
            f"{k} {v}" if v in ("true", "false") else f"{k} '{v}'" for k, v in options.items()
        )
        con.execute(f"CREATE SECRET lake (TYPE s3, {quoted})")
    return con


def duckdb_table(tdir: str, s3: S3Config | None = None) -> pa.Table:
    """The current version through ``iceberg_scan(<metadata_location>)``."""
    location = read_manifest(tdir)["iceberg"]["metadata_location"]
    con = duckdb_connection(s3)
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


def assert_readers_equal_source(
    config: PipelineConfig,
    tables: list[str],
    spark: Mapping[tuple[str, str], pa.Table] | None = None,
) -> None:
    """Each table read through its manifest, through pyiceberg (catalog) and through DuckDB's
    ``iceberg_scan`` (the metadata file ``current.json`` names) equals its source (the rows its
    configured ``where`` keeps), row for row (by
    its primary or first unique key; a table without one as the multiset of its rows); and each of
    ``spark``'s reads ((table, way) -> rows, tests/spark_iceberg.py) too."""
    s3 = config.output.s3 if objectstore.is_s3(config.output.path) else None
    with Source.from_pipeline(config) as source:
        conn = connect(config.source.host, config.source.port, "root", "")
        try:
            for name in tables:
                info = source.table_info(name)
                tdir = table_dir(config, name)
                expected = source_rows(conn, info, config.table_where(name))
                assert expected, (
                    f"{name}: the source table is empty, so the comparison would prove nothing"
                )
                readers = {
                    "manifest": published_rows(tdir),
                    "pyiceberg": pyiceberg_table(config, name).to_pylist(),
                    "duckdb": duckdb_table(tdir, s3).to_pylist(),
                }
                for (table, way), arrow in (spark or {}).items():
                    if table == name:
                        readers[f"spark ({way})"] = arrow.to_pylist()
                key = info.primary_key or next(iter(info.unique_not_null_keys), ())
                for reader, rows in readers.items():
                    result = (
                        compare(info, tuple(key), expected, rows)
                        if key
                        else compare_multisets(info, expected, rows)
                    )
                    assert result.equal, f"{name} through {reader}: {result.summary()}"
                assert (
                    open_catalog(config).load_table(name).metadata_location
                    == read_manifest(tdir)["iceberg"]["metadata_location"]
                )
        finally:
            conn.close()
