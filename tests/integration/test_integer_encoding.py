"""``output.integer_encoding``: the data files a run writes itself (a small table's snapshot, an
incremental run's rewrite) store integer-held columns DELTA_BINARY_PACKED by default and PLAIN
where the config says ``plain``, each pipeline as its own config says when one process runs
two; the lake equals the source either way (docs/output.md, "The Iceberg table")."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import PipelineConfig
from orchestrator.lake import storage
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import table_dir
from tests.conftest import assert_lake_equals_source, fresh_database, load_pipeline
from tests.iceberg_readers import assert_readers_equal_source

pytestmark = pytest.mark.integration

DB = "int_encoding"
TABLE = f"{DB}.orders"
INTEGER_COLUMNS = {"id", "qty", "day", "at", "amount"}


def configured(tmp_path: Path, server: LocalMariaDB, name: str, **output: str) -> PipelineConfig:
    tmp_path.mkdir()
    return load_pipeline(
        tmp_path,
        server,
        [{"name": TABLE}],
        name=name,
        output={"path": str(tmp_path / "lake"), **output},
        defaults={"read_margin_seconds": 0.0},
    )


def delta_columns(config: PipelineConfig) -> dict[str, set[str]]:
    """Each data file of the published version: its columns stored DELTA_BINARY_PACKED."""
    tdir = table_dir(config, TABLE)
    out: dict[str, set[str]] = {}
    for name in read_manifest(tdir)["files"]:
        meta = pq.ParquetFile(storage.local_path(storage.join(tdir, name))).metadata
        out[name] = {
            meta.row_group(g).column(c).path_in_schema
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if "DELTA_BINARY_PACKED" in meta.row_group(g).column(c).encodings
        }
    return out


def test_each_pipeline_writes_the_integer_encoding_its_config_names(
    mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    fresh_database(
        mariadb,
        DB,
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, qty INT, day DATE, at DATETIME(6),"
        " amount DECIMAL(12, 2), note VARCHAR(40), ratio DOUBLE)",
        "INSERT INTO orders SELECT seq, seq % 7, '2024-01-01' + INTERVAL seq DAY,"
        " '2024-01-01' + INTERVAL seq SECOND, seq / 100, CONCAT('n', seq), seq / 3"
        " FROM seq_1_to_3000",
    )
    plain = configured(tmp_path / "plain", mariadb, "enc_plain", integer_encoding="plain")
    delta = configured(tmp_path / "delta", mariadb, "enc_delta")
    assert (plain.output.integer_encoding, delta.output.integer_encoding) == ("plain", "delta")

    def run_both() -> None:
        for config in (plain, delta):
            assert (
                run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
            )

    run_both()  # snapshots, read by the driver (a small table)
    mariadb.execute(
        "UPDATE orders SET qty = qty + 1, amount = amount * 2 WHERE id % 50 = 0",
        "DELETE FROM orders WHERE id % 97 = 0",
        "INSERT INTO orders SELECT 10000 + seq, seq, '2030-01-01', NOW(6), 1.5, 'new', NULL"
        " FROM seq_1_to_200",
        database=DB,
    )
    run_both()  # incremental runs: every file rewritten

    for config in (plain, delta):
        assert read_manifest(table_dir(config, TABLE))["version"] == 2
        assert_lake_equals_source(config, mariadb, [TABLE])
        assert_readers_equal_source(config, [TABLE])
    assert all(not columns for columns in delta_columns(plain).values())
    assert all(columns == INTEGER_COLUMNS for columns in delta_columns(delta).values())
