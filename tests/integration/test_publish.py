"""Publish on real files: manifest contract, atomic switch, versions, retention, reruns."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from orchestrator.errors import RunFailed
from orchestrator.lake.iceberg import open_catalog
from orchestrator.lake.manifest import read_manifest, read_published
from orchestrator.pipeline.publish.versions import publish_table
from orchestrator.pipeline.reconcile.spark import reconcile_table
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import arrow_type
from orchestrator.schema.values import staging_schema
from tests.iceberg_readers import duckdb_table, pyiceberg_table
from tests.integration.conftest import spark_test_config

pytestmark = pytest.mark.integration

TABLE = TableInfo(
    "shop",
    "orders",
    (
        ColumnInfo("id", "bigint", "bigint(20) unsigned", False, precision=20, scale=0),
        ColumnInfo("name", "varchar", "varchar(20)", True),
        ColumnInfo("took", "time", "time(6)", True, datetime_precision=6),
        ColumnInfo("at", "datetime", "datetime(6)", False, datetime_precision=6),
        ColumnInfo("ts", "timestamp", "timestamp", True, datetime_precision=0),
        ColumnInfo("flag", "tinyint", "tinyint(1)", False),
        ColumnInfo("day", "date", "date", True),
    ),
    ("id",),
    (),
    0,
)

KEYS = {
    "table",
    "version",
    "files",
    "position",
    "rows",
    "columns",
    "chunk_key",
    "published_at",
    "run_id",
    "iceberg",
}
ADDED_KEYS = {"file_ranges"}  # docs/output.md: fields beyond the documented manifest
H = BinlogPosition("binlog.000007", 1234, gtid_set="0-1-42", server_id=1)


def staged(i: int, name: str) -> dict[str, Any]:
    return {
        "id": Decimal(i),
        "name": name,
        "took": -i * 1_000_001,
        "at": dt.datetime(2024, 1, 1, 0, 0, i % 60),
        "ts": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        "flag": i % 2 == 0,
        "day": None if i % 3 else dt.date(2024, 2, i % 28 + 1),
    }


def published(row: dict[str, Any]) -> dict[str, Any]:
    return dict(row)  # TIME stays signed int64 microseconds


def staging_dir(spark: Any, tmp_path: Path, rows: list[dict[str, Any]], name: str) -> str:
    """A reconciled staging dir as Spark writes it (base rows, no changes)."""
    base = tmp_path / f"{name}-base"
    base.mkdir()
    schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(TABLE.columns))
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), base / "part-00000.parquet")
    out = tmp_path / f"{name}-reconciled"
    reconcile_table(spark, TABLE, ("id",), [str(base)], str(tmp_path / "no-changes"), str(out))
    return str(out)


def untagged(names: Any) -> list[str]:
    """Data file names without their publish attempt's tag, sorted."""
    return sorted(re.sub(r"-[0-9a-f]{8}-", "-", n) for n in names)


def committed_files(config: Any) -> list[str]:
    """The data files of the Iceberg table's current snapshot, relative to the table dir."""
    table = open_catalog(config).load_table("shop.orders")
    return sorted(
        "data/" + f.file.file_path.rsplit("/data/", 1)[1] for f in table.scan().plan_files()
    )


def rows_of(tdir: Path) -> list[dict[str, Any]]:
    manifest = read_manifest(str(tdir))
    table = ds.dataset([str(tdir / f) for f in manifest["files"]], format="parquet").to_table()
    return sorted(table.to_pylist(), key=lambda x: x["id"])


def test_manifest_and_files_follow_the_contract(spark: Any, tmp_path: Path) -> None:
    config = spark_test_config(tmp_path)
    rows = [staged(i, f"n{i}") for i in range(1, 21)]
    manifest = publish_table(
        config, TABLE, ("id",), staging_dir(spark, tmp_path, rows, "a"), H, "run-1"
    )
    tdir = tmp_path / "lake" / "shop" / "orders"

    on_disk = json.loads((tdir / "_tidemark" / "current.json").read_text())
    assert (
        on_disk
        == manifest
        == json.loads((tdir / "_tidemark" / "versions" / "000001.json").read_text())
    )
    assert set(on_disk) == KEYS | ADDED_KEYS
    [name] = on_disk["files"]  # named by version, publish attempt and index
    assert re.fullmatch(r"data/v000001-[0-9a-f]{8}-c0000\.parquet", name)
    assert on_disk["file_ranges"] == [
        {
            "file": name,
            "min_key": [{"decimal": "1"}],
            "max_key": [{"decimal": "20"}],
            "rows": 20,
            "bytes": (tdir / name).stat().st_size,
        }
    ]
    assert on_disk["table"] == "shop.orders" and on_disk["version"] == 1 and on_disk["rows"] == 20
    assert on_disk["position"] == {
        "file": "binlog.000007",
        "pos": 1234,
        "gtid_set": "0-1-42",
        "server_id": 1,
        "server_uuid": None,
    }
    assert on_disk["chunk_key"] == ["id"] and on_disk["run_id"] == "run-1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", on_disk["published_at"])
    assert on_disk["columns"][0] == {
        "name": "id",
        "mysql_type": "bigint(20) unsigned",
        "arrow_type": "decimal128(20, 0)",
        "nullable": False,
    }
    assert [c["arrow_type"] for c in on_disk["columns"]] == [
        str(arrow_type(c)) for c in TABLE.columns
    ]
    assert next(c for c in on_disk["columns"] if c["name"] == "at")[
        "nullable"
    ]  # zero dates -> NULL

    table = ds.dataset([str(tdir / f) for f in on_disk["files"]], format="parquet").to_table()
    assert [f.type for f in table.schema] == [arrow_type(c) for c in TABLE.columns]
    assert table.schema.field("took").metadata == {b"PARQUET:field_id": b"3"}
    assert sorted(table.to_pylist(), key=lambda x: x["id"]) == [published(x) for x in rows]
    assert on_disk["iceberg"]["identifier"] == "shop.orders"
    for reader in (duckdb_table(str(tdir)), pyiceberg_table(config, "shop.orders")):
        assert sorted(reader.to_pylist(), key=lambda x: x["id"]) == [published(x) for x in rows]
    assert read_published(str(tdir)).num_rows == 20
    assert sorted(os.listdir(tdir / "_tidemark")) == ["current.json", "versions"]
    assert sorted(os.listdir(tdir)) == ["_tidemark", "data", "metadata"]
    # The manifest before the Iceberg commit is in the run's staging (deleted with it at the run's
    # end).
    (pending,) = (Path(config.staging_path) / "run-1" / "pending").iterdir()
    assert json.loads(pending.read_text()) == {
        "shop.orders": {k: v for k, v in on_disk.items() if k != "iceberg"}
    }
    assert on_disk["iceberg"]["identifier"] == "shop.orders"


def test_versions_increment_and_retention_drops_old_files(spark: Any, tmp_path: Path) -> None:
    config = spark_test_config(tmp_path, keep_versions=2, keep_hours=0)
    tdir = tmp_path / "lake" / "shop" / "orders"
    for n in (1, 2, 3):
        rows = [staged(i, f"v{n}") for i in range(1, 6 + n)]
        manifest = publish_table(
            config,
            TABLE,
            ("id",),
            staging_dir(spark, tmp_path, rows, f"r{n}"),
            BinlogPosition("binlog.000007", 1000 * n),
            f"run-{n}",
        )
        assert manifest["version"] == n and manifest["rows"] == len(rows)
        assert rows_of(tdir) == [published(x) for x in rows]
    assert sorted(os.listdir(tdir / "_tidemark" / "versions")) == ["000002.json", "000003.json"]
    assert untagged(os.listdir(tdir / "data")) == ["v000002-c0000.parquet", "v000003-c0000.parquet"]
    previous = json.loads((tdir / "_tidemark" / "versions" / "000002.json").read_text())
    old = ds.dataset([str(tdir / f) for f in previous["files"]], format="parquet").to_table()
    assert old.num_rows == 7 and set(old.column("name").to_pylist()) == {"v2"}


def test_rerun_of_a_published_run_returns_its_manifest(spark: Any, tmp_path: Path) -> None:
    config = spark_test_config(tmp_path)
    rows = [staged(i, "x") for i in range(1, 4)]
    reconciled = staging_dir(spark, tmp_path, rows, "a")
    first = publish_table(config, TABLE, ("id",), reconciled, H, "run-1")
    again = publish_table(config, TABLE, ("id",), reconciled, H, "run-1")
    assert again == first
    assert os.listdir(tmp_path / "lake" / "shop" / "orders" / "data") == [
        first["files"][0][len("data/") :]
    ]


def test_rerun_after_a_crash_before_the_switch_cleans_partial_files(
    spark: Any, tmp_path: Path
) -> None:
    config = spark_test_config(tmp_path)
    tdir = tmp_path / "lake" / "shop" / "orders"
    publish_table(
        config, TABLE, ("id",), staging_dir(spark, tmp_path, [staged(1, "old")], "a"), H, "run-1"
    )
    # What crashed attempts of run-2 could leave (before its Iceberg commit): some of their files, a
    # pending manifest, and one of a release before attempts even its version manifest.
    (tdir / "data" / "v000002-0badc0de-c0000.parquet").write_bytes(b"half a file")
    (tdir / "data" / "v000002-c0003.parquet").write_bytes(b"from a wider attempt")
    (tdir / "_tidemark" / "pending").mkdir()  # where a release before kept it
    (tdir / "_tidemark" / "pending" / "000002-0badc0de.json").write_text("{not json")
    (tdir / "_tidemark" / "versions" / "000002.json").write_text("{not json")
    assert read_manifest(str(tdir))["version"] == 1

    rows = [staged(i, "new") for i in range(1, 4)]
    manifest = publish_table(
        config, TABLE, ("id",), staging_dir(spark, tmp_path, rows, "b"), H, "run-2"
    )
    assert manifest["version"] == 2 and untagged(f[len("data/") :] for f in manifest["files"]) == [
        "v000002-c0000.parquet"
    ]
    # Once version 2 is current nothing can list the crashed attempts' files: retention deletes
    # them.
    assert untagged(os.listdir(tdir / "data")) == ["v000001-c0000.parquet", "v000002-c0000.parquet"]
    assert (
        "0badc0de" not in manifest["files"][0] and os.listdir(tdir / "_tidemark" / "pending") == []
    )
    assert rows_of(tdir) == [published(x) for x in rows]
    assert json.loads((tdir / "_tidemark" / "versions" / "000002.json").read_text()) == manifest


@pytest.mark.parametrize("pending_in", ["staging", "the table (a release before)"])
def test_failed_switch_leaves_the_previous_version_current(
    spark: Any, tmp_path: Path, pending_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = spark_test_config(tmp_path)
    tdir = tmp_path / "lake" / "shop" / "orders"
    publish_table(
        config, TABLE, ("id",), staging_dir(spark, tmp_path, [staged(1, "old")], "a"), H, "run-1"
    )
    reconciled = staging_dir(spark, tmp_path, [staged(2, "new")], "b")

    def crash(src: Any, dst: Any) -> None:
        if str(dst).endswith("current.json"):
            raise OSError("power cut")
        real_replace(src, dst)

    real_replace = os.replace
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        publish_table(config, TABLE, ("id",), reconciled, H, "run-2")
    monkeypatch.undo()
    assert read_manifest(str(tdir))["run_id"] == "run-1"
    assert [x["name"] for x in rows_of(tdir)] == ["old"]
    assert sorted(os.listdir(tdir / "_tidemark")) == ["current.json", "versions"]
    assert sorted(os.listdir(tdir)) == ["_tidemark", "data", "metadata"]
    (pending,) = (Path(config.staging_path) / "run-2" / "pending").iterdir()
    if pending_in != "staging":  # a release before wrote the attempt's manifest into the table
        attempt = pending.name.removesuffix(".json")
        (tdir / "_tidemark" / "pending").mkdir()
        (tdir / "_tidemark" / "pending" / f"000002-{attempt}.json").write_text(
            json.dumps(json.loads(pending.read_text())["shop.orders"])
        )
        pending.unlink()

    # The Iceberg snapshot was committed: the rerun switches to it from the attempt's manifest.
    again = publish_table(config, TABLE, ("id",), reconciled, H, "run-2")
    assert again["version"] == 2 and again["files"] == committed_files(config)
    assert [x["name"] for x in rows_of(tdir)] == ["new"]
    assert len(open_catalog(config).load_table("shop.orders").snapshots()) == 2, (
        "switched to, not committed again"
    )


def test_empty_table_publishes_one_empty_file_with_the_schema(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = spark_test_config(tmp_path)
    with caplog.at_level(logging.INFO):
        manifest = publish_table(
            config, TABLE, ("id",), staging_dir(spark, tmp_path, [], "a"), H, "run-1"
        )
    assert manifest["rows"] == 0 and len(manifest["files"]) == 1
    # the file's columns have no statistics, as an empty file's: nothing to warn of
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    table = read_published(str(tmp_path / "lake" / "shop" / "orders"))
    assert table.num_rows == 0 and [f.type for f in table.schema] == [
        arrow_type(c) for c in TABLE.columns
    ]


def test_incremental_run_reconciles_against_the_published_version(
    spark: Any, tmp_path: Path
) -> None:
    config = spark_test_config(tmp_path)
    tdir = tmp_path / "lake" / "shop" / "orders"
    rows = [staged(i, "v1") for i in range(1, 5)]
    publish_table(config, TABLE, ("id",), staging_dir(spark, tmp_path, rows, "a"), H, "run-1")

    changes = tmp_path / "changes"
    changes.mkdir()
    schema = pa.schema(
        [
            pa.field("_tm_file", pa.int64()),
            pa.field("_tm_pos", pa.int64()),
            pa.field("_tm_row", pa.int64()),
            pa.field("_tm_op", pa.string()),
            *[pa.field(f.name, f.type) for f in staging_schema(TABLE.columns)],
            pa.field("_tm_old_id", pa.decimal128(20, 0)),
        ]
    )
    update = {**staged(2, "v2"), "took": 90_000_000_001}
    change_rows = [
        {
            "_tm_file": 8,
            "_tm_pos": 4,
            "_tm_row": 0,
            "_tm_op": "U",
            **update,
            "_tm_old_id": Decimal(2),
        },
        {
            "_tm_file": 8,
            "_tm_pos": 9,
            "_tm_row": 0,
            "_tm_op": "D",
            **rows[0],
            "_tm_old_id": Decimal(1),
        },
    ]
    pq.write_table(pa.Table.from_pylist(change_rows, schema=schema), changes / "seg-000000.parquet")

    base = [str(tdir / f) for f in read_manifest(str(tdir))["files"]]
    out = tmp_path / "reconciled-2"
    assert reconcile_table(spark, TABLE, ("id",), base, str(changes), str(out)) == 3
    manifest = publish_table(
        config, TABLE, ("id",), str(out), BinlogPosition("binlog.000008", 9), "run-2"
    )
    assert manifest["version"] == 2 and manifest["position"]["file"] == "binlog.000008"
    assert rows_of(tdir) == [published(x) for x in (update, rows[2], rows[3])]


def test_read_manifest_of_an_unpublished_table(tmp_path: Path) -> None:
    with pytest.raises(RunFailed, match=r"current\.json"):
        read_manifest(str(tmp_path / "nothing"))
