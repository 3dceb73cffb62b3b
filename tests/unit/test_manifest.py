"""Manifest shape, published schema and retention arithmetic (no Spark; pyarrow only)."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from orchestrator.config import parse_config
from orchestrator.errors import ConfigError, RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.manifest import (
    Manifest,
    Manifests,
    apply_retention,
    column_entries,
    files_to_drop,
    find_manifest,
    load_pending,
    manifest_json,
    pending_json,
    published_schema,
)
from orchestrator.lake.writer import data_file, to_published
from orchestrator.pipeline.publish.versions import publish_table
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import staging_schema

COLUMNS = (
    ColumnInfo("id", "int", "int(10) unsigned", False),
    ColumnInfo("d", "date", "date", False),
    ColumnInfo("t", "time", "time(3)", True, datetime_precision=3),
    ColumnInfo("big", "decimal", "decimal(50,2)", True, precision=50, scale=2),
)
TABLE = TableInfo("db", "t", COLUMNS, ("id",), (), 0)


def manifest(version: int, files: list[str]) -> Manifest:
    return Manifest(
        table="db.t",
        version=version,
        files=files,
        position={"file": "binlog.000001", "pos": 4, "gtid_set": None},
        rows=0,
        columns=[],
        chunk_key=["id"],
        published_at="2026-01-01T00:00:00Z",
        run_id=f"r{version}",
    )


@pytest.mark.parametrize(
    ("files", "keep", "dropped", "garbage"),
    [
        ({1: ["a"], 2: ["b"], 3: ["c"]}, 2, [1], ["a"]),
        ({1: ["a", "shared"], 2: ["shared", "b"], 3: ["shared", "c"]}, 1, [1, 2], ["a", "b"]),
        ({1: ["a"], 2: ["b"]}, 5, [], []),
        ({1: ["a"]}, 1, [], []),
        ({4: ["x", "y"], 7: ["y"], 9: ["z"]}, 2, [4], ["x"]),
    ],
)
def test_files_to_drop(
    files: dict[int, list[str]], keep: int, dropped: list[int], garbage: list[str]
) -> None:
    manifests = {v: manifest(v, f) for v, f in files.items()}
    assert files_to_drop(manifests, keep) == (dropped, garbage)


def test_data_file_names() -> None:
    assert data_file(1, 0) == "data/v000001-c0000.parquet"
    assert data_file(123456, 42) == "data/v123456-c0042.parquet"
    assert (
        data_file(2, 3, "a1b2c3d4") == "data/v000002-a1b2c3d4-c0003.parquet"
    )  # one publish attempt's


def test_published_schema_and_column_entries() -> None:
    schema = published_schema(COLUMNS)
    assert schema.types == [pa.int64(), pa.date32(), pa.int64(), pa.string()]
    assert schema.field("id").nullable is False
    assert schema.field("d").nullable is True  # a NOT NULL DATE can hold a zero date -> NULL
    assert schema.field("t").metadata == {b"mysql_type": b"time(3)"}
    assert column_entries(COLUMNS) == [
        {"name": "id", "mysql_type": "int(10) unsigned", "arrow_type": "int64", "nullable": False},
        {"name": "d", "mysql_type": "date", "arrow_type": "date32[day]", "nullable": True},
        {"name": "t", "mysql_type": "time(3)", "arrow_type": "int64", "nullable": True},
        {"name": "big", "mysql_type": "decimal(50,2)", "arrow_type": "string", "nullable": True},
    ]


def test_to_published_keeps_time_as_micros_and_nulls() -> None:
    staging = pa.schema(pa.field(f.name, f.type) for f in staging_schema(COLUMNS))
    batch = pa.RecordBatch.from_pylist(
        [
            {"id": 4294967295, "d": dt.date(1000, 1, 1), "t": -3020399000000, "big": "-1.50"},
            {"id": 0, "d": None, "t": None, "big": None},
        ],
        schema=staging,
    )
    out = to_published(batch, published_schema(COLUMNS))
    assert out.schema == published_schema(COLUMNS)
    assert out.column("t").to_pylist() == [-3020399000000, None]
    assert out.column("id").to_pylist() == [4294967295, 0]
    # A file of a version published before TIME was int64 holds duration[us]: same microseconds.
    older = batch.set_column(2, "t", batch.column("t").view(pa.duration("us")))
    assert to_published(older, published_schema(COLUMNS)).column("t").to_pylist() == [
        -3020399000000,
        None,
    ]


def write_staging(directory: Path, rows: list[dict[str, Any]]) -> str:
    directory.mkdir(parents=True)
    staging = pa.schema(pa.field(f.name, f.type) for f in staging_schema(COLUMNS))
    pq.write_table(
        pa.Table.from_pylist(rows, schema=staging),
        directory / "part-00000.parquet",
        row_group_size=2,
    )
    return str(directory)


def test_publish_streams_batches_and_keeps_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Spark: staging files written by pyarrow, in small record batches."""
    monkeypatch.setattr(layout, "BATCH_ROWS", 2)
    config = parse_config(
        {
            "pipeline": "p",
            "source": {"host": "h", "user": "u", "server_id": 1},
            "output": {"path": str(tmp_path / "lake"), "keep_versions": 2, "keep_hours": 0},
            "state": {"url": "sqlite://"},
            "tables": [{"name": "db.t"}],
        },
        check_env=False,
    )
    tdir = tmp_path / "lake" / "db" / "t"
    read: list[str] = []
    real = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda uri: read.append(uri) or real(uri))
    for n in range(1, 5):
        times = [i * n for i in range(5 * n)]
        rows = [{"id": i, "d": None, "t": t, "big": f"{i}.{n:02d}"} for i, t in enumerate(times)]
        read.clear()
        result = publish_table(
            config,
            TABLE,
            ("id",),
            write_staging(tmp_path / f"s{n}", rows),
            BinlogPosition(f"binlog.{n:06d}", 4),
            f"run-{n}",
        )
        assert result["version"] == n and result["rows"] == len(rows)
        # current.json read twice: what the publish starts from, and just before the switch (a
        # newer version there would be another writer's); retention is handed the new manifest
        assert [Path(uri).name for uri in read].count("current.json") == 2
        table = ds.dataset([str(tdir / f) for f in result["files"]], format="parquet").to_table()
        assert table.column("t").to_pylist() == times
        assert result["file_ranges"] == [
            {
                "file": result["files"][0],
                "min_key": [0],
                "max_key": [5 * n - 1],
                "rows": 5 * n,
                "bytes": (tdir / result["files"][0]).stat().st_size,
            }
        ]
        assert json.loads((tdir / "_tidemark" / "current.json").read_text())["version"] == n
    assert sorted(p.name for p in (tdir / "_tidemark" / "versions").iterdir()) == [
        "000003.json",
        "000004.json",
    ]
    names = sorted(p.name for p in (tdir / "data").iterdir())
    assert [re.sub(r"-[0-9a-f]{8}-", "-", n) for n in names] == [
        "v000003-c0000.parquet",
        "v000004-c0000.parquet",
    ]


def test_retention_never_drops_files_a_kept_version_shares(tmp_path: Path) -> None:
    tdir = tmp_path / "t"
    (tdir / "_tidemark" / "versions").mkdir(parents=True)
    (tdir / "data").mkdir()
    plan = {
        1: ["data/v000001-c0000.parquet", "data/v000001-c0001.parquet"],
        2: ["data/v000001-c0001.parquet", "data/v000002-c0000.parquet"],
        3: ["data/v000001-c0001.parquet", "data/v000003-c0000.parquet"],
    }
    for version, files in plan.items():
        for f in files:
            (tdir / f).write_bytes(b"x")
        body = manifest_json(manifest(version, files))
        (tdir / "_tidemark" / "versions" / f"{version:06d}.json").write_bytes(body)
    (tdir / "_tidemark" / "current.json").write_bytes(manifest_json(manifest(3, plan[3])))

    assert apply_retention(str(tdir), 1) == [1, 2]
    assert sorted(p.name for p in (tdir / "data").iterdir()) == [
        "v000001-c0001.parquet",
        "v000003-c0000.parquet",
    ]
    assert [p.name for p in (tdir / "_tidemark" / "versions").iterdir()] == ["000003.json"]
    assert apply_retention(str(tdir), 1) == []


def test_retention_takes_the_current_manifest_its_writer_gives_and_reads_it_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publish hands over the manifest it just switched to: neither ``current.json`` nor that
    version's file is read again (two requests each on an object store)."""
    tdir = tmp_path / "t"
    (tdir / "_tidemark" / "versions").mkdir(parents=True)
    (tdir / "data").mkdir()
    files = {v: [f"data/v{v:06d}-c0000.parquet"] for v in (1, 2, 3)}
    for version, names in files.items():
        (tdir / names[0]).write_bytes(b"x")
        body = manifest_json(manifest(version, names))
        (tdir / "_tidemark" / "versions" / f"{version:06d}.json").write_bytes(body)
    (tdir / "_tidemark" / "current.json").write_bytes(manifest_json(manifest(3, files[3])))
    read: list[str] = []
    real = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda uri: read.append(uri) or real(uri))

    assert apply_retention(str(tdir), 1, current=manifest(3, files[3])) == [1, 2]
    assert sorted(Path(uri).name for uri in read) == ["000001.json", "000002.json"]
    assert sorted(p.name for p in (tdir / "data").iterdir()) == ["v000003-c0000.parquet"]
    assert [p.name for p in (tdir / "_tidemark" / "versions").iterdir()] == ["000003.json"]


def test_retention_takes_older_manifests_the_caller_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publish also hands over the version that was current when it began (``known``): its file
    is not read; a known version whose file is gone (dropped before) is not taken as kept."""
    tdir = tmp_path / "t"
    (tdir / "_tidemark" / "versions").mkdir(parents=True)
    (tdir / "data").mkdir()
    files = {v: [f"data/v{v:06d}-c0000.parquet"] for v in (1, 2, 3, 4)}
    for version, names in files.items():
        (tdir / names[0]).write_bytes(b"x")
        if version > 1:
            body = manifest_json(manifest(version, names))
            (tdir / "_tidemark" / "versions" / f"{version:06d}.json").write_bytes(body)
    (tdir / "data" / files[1][0].split("/")[1]).unlink()
    read: list[str] = []
    real = storage.read_bytes
    monkeypatch.setattr(storage, "read_bytes", lambda uri: read.append(uri) or real(uri))

    known = [manifest(3, files[3]), manifest(1, files[1])]
    assert apply_retention(str(tdir), 2, current=manifest(4, files[4]), known=known) == [2]
    assert [Path(uri).name for uri in read] == ["000002.json"]
    assert sorted(p.name for p in (tdir / "data").iterdir()) == [
        "v000003-c0000.parquet",
        "v000004-c0000.parquet",
    ]


def test_retention_keeps_every_version_younger_than_keep_hours(tmp_path: Path) -> None:
    """`keep_versions` AND `keep_hours`: a version a long query may still read is kept."""
    tdir = tmp_path / "t"
    (tdir / "_tidemark" / "versions").mkdir(parents=True)
    (tdir / "data").mkdir()
    now = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
    ages = {1: 50, 2: 30, 3: 23, 4: 2, 5: 0}  # hours before now
    for version, hours in ages.items():
        (tdir / "data" / f"v{version}.parquet").write_bytes(b"x")
        body = manifest(version, [f"data/v{version}.parquet"])
        body["published_at"] = (now - dt.timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        (tdir / "_tidemark" / "versions" / f"{version:06d}.json").write_bytes(manifest_json(body))
        if version == 5:
            (tdir / "_tidemark" / "current.json").write_bytes(manifest_json(body))

    assert apply_retention(str(tdir), 4, keep_hours=24, now=now) == [1]  # the count keeps 2..5
    assert apply_retention(str(tdir), 1, keep_hours=24, now=now) == [2]  # the age keeps 3 and 4
    assert sorted(p.name for p in (tdir / "data").iterdir()) == [
        "v3.parquet",
        "v4.parquet",
        "v5.parquet",
    ]
    assert apply_retention(str(tdir), 1, keep_hours=24, now=now + dt.timedelta(hours=23)) == [3, 4]
    assert apply_retention(str(tdir), 1, keep_hours=24, now=now) == []


def test_keep_hours_is_read_and_checked(tmp_path: Path) -> None:
    def config(output: dict[str, Any]) -> Any:
        return parse_config(
            {
                "pipeline": "p",
                "source": {"host": "h", "user": "u", "server_id": 1},
                "output": {"path": str(tmp_path), **output},
                "state": {"url": "sqlite://"},
                "tables": [{"name": "db.t"}],
            },
            check_env=False,
        )

    assert config({}).output.keep_hours == 24
    assert config({"keep_hours": 0.5}).output.keep_hours == 0.5
    with pytest.raises(ConfigError, match=r"output\.keep_hours: must be >= 0"):
        config({"keep_hours": -1})


def test_retention_deletes_what_attempts_left_only_up_to_the_current_version(
    tmp_path: Path,
) -> None:
    """Leftovers of publish attempts that never switched: deleted once their version is no newer
    than the current one (nothing can come to list them), kept above it (an attempt may be
    writing that version now)."""
    tdir = tmp_path / "t"
    (tdir / "_tidemark" / "versions").mkdir(parents=True)
    (tdir / "_tidemark" / "pending").mkdir()
    (tdir / "data").mkdir()
    files = {1: ["data/v000001-aaaaaaaa-c0000.parquet"], 2: ["data/v000002-bbbbbbbb-c0000.parquet"]}
    for version, listed in files.items():
        (tdir / listed[0]).write_bytes(b"x")
        (tdir / "_tidemark" / "versions" / f"{version:06d}.json").write_bytes(
            manifest_json(manifest(version, listed))
        )
    (tdir / "_tidemark" / "current.json").write_bytes(manifest_json(manifest(2, files[2])))
    left = [
        "data/v000002-0badc0de-c0000.parquet",
        "data/v000001-c0003.parquet",  # crashed attempts
        "_tidemark/pending/000002-0badc0de.json",
        "_tidemark/pending/000002-bbbbbbbb.json",
    ]
    in_flight = ["data/v000003-cccccccc-c0000.parquet", "_tidemark/pending/000003-cccccccc.json"]
    for relative in left + in_flight:
        (tdir / relative).write_bytes(b"x")
    asked: list[list[int]] = []

    def expire(dropped: list[int]) -> set[str]:
        asked.append(dropped)
        return set()

    assert apply_retention(str(tdir), 5, expire) == []
    assert asked == [[]]  # the kept Iceberg snapshots' files are asked for before deleting
    remaining = {str(p.relative_to(tdir)) for p in tdir.rglob("*") if p.is_file()}
    assert not remaining & set(left)
    assert remaining >= {*in_flight, *files[1], *files[2], "_tidemark/current.json"}
    apply_retention(str(tdir), 5, expire)
    assert asked == [[]]  # nothing left to delete: Iceberg is not asked again


def test_plans_of_many_tables_share_one_file(tmp_path: Path) -> None:
    """`layout.write_plans`: each table's plan is read back by `read_plan` of its reconciled dir,
    which is never created; a name the file lacks is an error, never a whole-table publish."""
    entry = {
        "file": "data/v000001-c0000.parquet",
        "min_key": [1],
        "max_key": [9],
        "rows": 9,
        "bytes": 99,
    }
    plans = {
        f"db.t{i}": layout.VersionPlan(i, (), (layout.planned(entry, entry["file"], True),))  # type: ignore[arg-type]
        for i in range(3)
    }
    batch = str(tmp_path / "reconciled" / "_kept-1a2b3c4d")
    layout.write_plans(batch, plans)
    for name, plan in plans.items():
        out_dir = f"{batch}/{name}"
        assert not Path(out_dir).exists()
        assert layout.read_plan(out_dir) == plan
    with pytest.raises(RunFailed, match=r"holds no plan of db\.t9"):
        layout.read_plan(f"{batch}/db.t9")
    assert (
        layout.read_plan(str(tmp_path / "reconciled" / "db.t0-00000000")) is None
    )  # staging files, no plan


def test_pending_manifests_of_a_group_are_read_back_by_table(tmp_path: Path) -> None:
    uri = str(tmp_path / "pending" / "abc.json")
    assert load_pending(uri, "shop.a") is None  # no file: no attempt wrote there
    first: Any = {"table": "shop.a", "version": 3, "files": ["data/v000003-abc-c0000.parquet"]}
    second: Any = {"table": "shop.b", "version": 1, "files": []}
    (tmp_path / "pending").mkdir()
    Path(uri).write_bytes(pending_json({"shop.a": first, "shop.b": second}))
    assert load_pending(uri, "shop.a") == first
    assert load_pending(uri, "shop.b") == second
    assert load_pending(uri, "shop.c") is None
    Path(uri).write_bytes(b'{"shop.a": ')  # cut short
    with pytest.raises(RunFailed, match=r"cannot read the pending manifests .*abc\.json"):
        load_pending(uri, "shop.a")


def test_manifests_read_together_give_what_find_manifest_gives_each(tmp_path: Path) -> None:
    """`Manifests` (read by threads here: on an object store each read is two round trips) gives
    each table dir's manifest as `find_manifest` does: a table with none is None, an unreadable
    one raises for that table alone, when asked; a dir not given is read when asked; no reader
    thread outlives the block."""
    dirs = {name: tmp_path / name for name in ("a", "b", "none", "broken")}
    for name in ("a", "b"):
        (dirs[name] / "_tidemark").mkdir(parents=True)
        (dirs[name] / "_tidemark" / "current.json").write_text(json.dumps({"version": len(name)}))
    (dirs["broken"] / "_tidemark").mkdir(parents=True)
    (dirs["broken"] / "_tidemark" / "current.json").write_text("{not json")
    (tmp_path / "later" / "_tidemark").mkdir(parents=True)
    (tmp_path / "later" / "_tidemark" / "current.json").write_text('{"version": 7}')
    with Manifests([str(d) for d in dirs.values()], readers=4) as manifests:
        assert threading.active_count() > 1
        assert manifests.find(str(dirs["a"])) == find_manifest(str(dirs["a"])) == {"version": 1}
        assert manifests.find(str(dirs["none"])) is None
        with pytest.raises(RunFailed, match="cannot read manifest"):
            manifests.find(str(dirs["broken"]))
        assert manifests.find(str(dirs["b"])) == {"version": 1}
        assert manifests.find(str(tmp_path / "later")) == {"version": 7}
    assert not [t for t in threading.enumerate() if t.name.startswith("tidemark-manifests")]
