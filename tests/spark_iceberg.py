"""Spark reading published tables through Iceberg's own Java library (``iceberg-spark-runtime``).

Run as a process of its own (`read_with_spark`): its session has ``iceberg-spark-runtime``, the
S3 connector and PostgreSQL's JDBC driver on its class path, and the pipeline's ``fs.s3a.*``
settings (`orchestrator.pipeline.context.session_settings`, as a run's session gets them). Each
table is read two ways and written as an Arrow IPC file for the test to compare with the source:

- ``load``: the table of the metadata file ``current.json`` names, as Iceberg's
  ``StaticTableOperations`` reads it (what ``spark.read.format("iceberg").load(<location>)`` does);
- ``catalog``: by name through Iceberg's ``JdbcCatalog`` over the state store's database, the SQL
  catalog pyiceberg committed to (the JDBC catalog has the pipeline's catalog name, which
  pyiceberg's SQL catalog writes as ``catalog_name``).

Iceberg's scan plans the data files (its ``HadoopFileIO`` over s3a) and Spark reads them.
Iceberg's Spark data source itself (``format("iceberg")``, ``SparkCatalog``) cannot load in
pyspark 4.3: Maven Central serves Iceberg runtimes up to Spark 4.1, whose classes fail against
4.3's (``IncompatibleClassChangeError: Found interface ...CatalogManager``); docs/spark.md.

    python tests/spark_iceberg.py CONFIG OUT_DIR JDBC_URL TABLE...
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa

#: The two ways each table is read (the file name's suffix).
WAYS = ("load", "catalog")


def read_with_spark(
    config_path: Path, out_dir: Path, jdbc_url: str, tables: list[str]
) -> dict[tuple[str, str], pa.Table]:
    """Every table of ``tables`` read both ways (`WAYS`) by a Spark process of its own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, __file__, str(config_path), str(out_dir), jdbc_url, *tables],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"Spark's Iceberg read failed:\n{done.stdout}\n{done.stderr}"
    found = {}
    for table in tables:
        for way in WAYS:
            with pa.ipc.open_file(out_dir / f"{table}.{way}.arrow") as reader:
                found[(table, way)] = reader.read_all()
    return found


def _main(config_path: str, out_dir: str, jdbc_url: str, tables: list[str]) -> None:
    from orchestrator.config import load_config
    from orchestrator.lake.manifest import read_manifest
    from orchestrator.pipeline.context import session_settings, table_dir
    from orchestrator.services import jars
    from orchestrator.services.spark import get_session

    config = load_config(config_path)
    settings = session_settings(config)
    extra = jars.jar_paths((jars.ICEBERG_SPARK, jars.POSTGRESQL_JDBC))
    spark = get_session(
        type(settings)(
            app_name="tidemark-iceberg-read",
            master="local[1]",
            conf=settings.conf,
            jars=settings.jars,
            class_path=(*settings.class_path, *extra),
        )
    )
    jvm = spark._jvm
    hadoop = spark._jsc.hadoopConfiguration()
    io = jvm.org.apache.iceberg.hadoop.HadoopFileIO(hadoop)
    catalog = jvm.org.apache.iceberg.jdbc.JdbcCatalog()
    catalog.setConf(hadoop)
    properties = jvm.java.util.HashMap()
    for key, value in {
        "uri": jdbc_url,
        "jdbc.user": "postgres",
        "warehouse": config.output.path,
        "io-impl": "org.apache.iceberg.hadoop.HadoopFileIO",
    }.items():
        properties.put(key, value)
    catalog.initialize(config.output.catalog.name, properties)
    for table in tables:
        location = read_manifest(table_dir(config, table))["iceberg"]["metadata_location"]
        found = {
            "load": jvm.org.apache.iceberg.BaseTable(
                jvm.org.apache.iceberg.StaticTableOperations(location, io), table
            ),
            "catalog": catalog.loadTable(
                jvm.org.apache.iceberg.catalog.TableIdentifier.parse(table)
            ),
        }
        for way, iceberg_table in found.items():
            files = []
            tasks = iceberg_table.newScan().planFiles().iterator()
            while tasks.hasNext():
                task = tasks.next()
                assert task.deletes().isEmpty(), f"{table}: a delete file"
                files.append(task.file().location().replace("s3://", "s3a://", 1))
            arrow = spark.read.parquet(*files).toArrow()
            with pa.ipc.new_file(Path(out_dir) / f"{table}.{way}.arrow", arrow.schema) as out:
                out.write_table(arrow)
    spark.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
