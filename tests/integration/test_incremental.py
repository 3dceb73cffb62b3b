"""Incremental runs rewrite only the files that hold changed keys (orchestrator.lake.layout).

Real local Spark for the reconcile, real files for publish, and the whole engine
against a private MariaDB. Each test checks the new version against a table
computed independently, that the files it did not need to touch are the very
same files (same paths, same inode and mtime), that every older retained
version still reads exactly as published, and the layout invariants: each file
sorted by key, files disjoint and ascending in manifest order, ``file_ranges``
equal to each file's first and last key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import logging
import os
import random
import re
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from chunking import decode_key
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.run import run_command
from orchestrator.config import load_config
from orchestrator.lake import layout
from orchestrator.lake.manifest import Manifest
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.publish.versions import publish_table
from orchestrator.pipeline.reconcile import rewrite as reconcile
from orchestrator.pipeline.reconcile.rewrite import Engine, reconcile_incremental
from orchestrator.pipeline.reconcile.spark import reconcile_table
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import staging_schema
from tests.conftest import assert_lake_equals_source, pipeline_config, write_config
from tests.integration.conftest import spark_test_config
from tests.integration.test_reconcile import CASES, Case, Change, D, I, U, write_changes

pytestmark = pytest.mark.integration

SIMPLE = TableInfo(
    "incr",
    "simple",
    (
        ColumnInfo("id", "int", "int(11)", False),
        ColumnInfo("v", "varchar", "varchar(20)", True),
        ColumnInfo("t", "time", "time(6)", True, datetime_precision=6),
    ),
    ("id",),
    (),
    0,
)

TEXT = TableInfo(
    "incr",
    "text",
    (
        ColumnInfo(
            "k", "varchar", "varchar(20)", False, charset="utf8mb4", collation="utf8mb4_general_ci"
        ),
        ColumnInfo("n", "int", "int(11)", False),
        ColumnInfo("v", "varchar", "varchar(20)", True),
    ),
    ("k", "n"),
    (),
    0,
)

Row = dict[str, Any]


def s(i: int, v: str = "base", t: int | None = None) -> Row:
    return {"id": i, "v": v, "t": i * 1_000_001 if t is None else t}


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def file_target(nbytes: int) -> Iterator[None]:
    """Publish with another target file size (1: a file per staging file, as the test wrote
    them)."""
    saved = layout.TARGET_FILE_BYTES
    layout.TARGET_FILE_BYTES = nbytes
    try:
        yield
    finally:
        layout.TARGET_FILE_BYTES = saved


class Lake:
    """One table's output dir, with what a test needs to publish versions into it."""

    def __init__(
        self, spark: Any, tmp_path: Path, table: TableInfo, engine: Engine = "auto", **output: Any
    ) -> None:
        self.spark, self.tmp, self.table, self.engine = spark, tmp_path, table, engine
        self.key = table.primary_key
        self.config = spark_test_config(tmp_path, **output)
        self.dir = tmp_path / "lake" / table.database / table.table
        self.runs = 0

    def publish_files(self, files: Sequence[Sequence[Row]]) -> Manifest:
        """Publish a first version from staging files written in this order (each sorted)."""
        staging = self.tmp / "staging-base"
        staging.mkdir()
        schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(self.table.columns))
        for n, rows in enumerate(files):
            pq.write_table(
                pa.Table.from_pylist(list(rows), schema=schema), staging / f"part-{n:05d}.parquet"
            )
        with file_target(1):
            return self._publish(str(staging))

    def publish_spark(self, rows: Sequence[Row]) -> Manifest:
        """Publish a first version laid out by Spark (range-partitioned, several files)."""
        base = self.tmp / "spark-base"
        base.mkdir()
        schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(self.table.columns))
        pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), base / "part-00000.parquet")
        out = self.tmp / "spark-reconciled"
        reconcile_table(
            self.spark,
            self.table,
            self.key,
            [str(base)],
            str(self.tmp / "none"),
            str(out),
            target_file_bytes=1,
        )
        with file_target(1):
            return self._publish(str(out))

    def apply(self, changes: Sequence[Change]) -> tuple[Manifest, int]:
        """An incremental run: reconcile ``changes`` against the current version and publish."""
        run = self.runs + 1
        changes_dir = self.tmp / f"changes-{run}"
        if changes:
            write_changes(changes_dir, self.table, changes)
        out = self.tmp / f"reconciled-{run}"
        rows = reconcile_incremental(
            self.spark,
            self.table,
            self.key,
            str(self.dir),
            str(changes_dir),
            str(out),
            engine=self.engine,
        )
        return self._publish(str(out)), rows

    def _publish(self, staging: str) -> Manifest:
        self.runs += 1
        return publish_table(
            self.config,
            self.table,
            self.key,
            staging,
            BinlogPosition("binlog.000001", 100 * self.runs),
            f"run-{self.runs}",
        )

    def manifest(self, version: int) -> Manifest:
        data: Manifest = json.loads(
            (self.dir / "_tidemark" / "versions" / f"{version:06d}.json").read_text()
        )
        return data

    def rows(self, version: int) -> list[Row]:
        files = [str(self.dir / f) for f in self.manifest(version)["files"]]
        return canonical(self.table, ds.dataset(files, format="parquet").to_table().to_pylist())

    def stats(self, manifest: Manifest) -> dict[str, tuple[int, int]]:
        return {f: _stat(self.dir / f) for f in manifest["files"]}


def _stat(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_ino, info.st_mtime_ns


def canonical(table: TableInfo, rows: Sequence[Row]) -> list[Row]:
    """Rows in staging values (TIME as micros), ordered by key as the files are (NULL first)."""
    out = []
    for row in rows:
        out.append(
            {
                c.name: (_micros(row[c.name]) if c.data_type == "time" else row[c.name])
                for c in table.columns
            }
        )
    return sorted(out, key=lambda r: sort_key(table, r))


def _micros(value: Any) -> Any:
    if value is None or isinstance(value, int):
        return value
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def sort_key(table: TableInfo, row: Row) -> tuple[Any, ...]:
    """The files' order as a test oracle: Python orders str by code point, as Spark orders UTF-8
    bytes."""
    return tuple(
        (row[k] is not None, row[k] if row[k] is not None else 0) for k in table.primary_key
    )


def expected_after(table: TableInfo, base: Sequence[Row], changes: Sequence[Change]) -> list[Row]:
    """The table after the changes, applied in position order, in plain Python."""
    rows = {tuple(r[k] for k in table.primary_key): dict(r) for r in base}
    for c in sorted(changes, key=lambda c: (c.file, c.pos, c.row_index)):
        full = {col.name: c.row.get(col.name) for col in table.columns}
        new_key = tuple(full[k] for k in table.primary_key)
        if c.op == "D":
            rows.pop(new_key, None)
            continue
        if c.op == "U" and c.old is not None:
            rows.pop(tuple(c.old), None)
        rows[new_key] = full
    return canonical(table, list(rows.values()))


def check_layout(lake: Lake, manifest: Manifest) -> None:
    """Every file sorted, files disjoint and ascending, file_ranges true to the files."""
    ranges = manifest["file_ranges"]
    assert [r["file"] for r in ranges] == manifest["files"]
    assert sum(r["rows"] for r in ranges) == manifest["rows"]
    bounds = []
    for entry in ranges:
        path = lake.dir / entry["file"]
        rows = pq.read_table(path).to_pylist()
        assert entry["rows"] == len(rows) and entry["bytes"] == path.stat().st_size
        keys = [sort_key(lake.table, canonical(lake.table, [r])[0]) for r in rows]
        assert keys == sorted(keys) and len(set(keys)) == len(keys), (
            f"{entry['file']} is not sorted by key"
        )
        if rows:
            first, last = (tuple(r[k] for k in lake.key) for r in (rows[0], rows[-1]))
            assert decode_key(entry["min_key"]) == first and decode_key(entry["max_key"]) == last
            bounds.append((keys[0], keys[-1]))
    for (_, high), (low, _) in itertools.pairwise(bounds):
        assert high < low, "files must hold disjoint, ascending key ranges"


# ----------------------------------------------------------------------------- reconcile + publish


@pytest.fixture(params=["spark", "local"])
def engine(request: pytest.FixtureRequest) -> Engine:
    """Both ways an incremental rewrite runs: Spark, and pyarrow in the driver (small rewrites)."""
    value: Engine = request.param
    return value


@pytest.fixture
def no_merging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test file is tiny; without this, the merge rule would fold them together."""
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 0)


def six_files() -> list[list[Row]]:
    """6 files of 10 rows: ids 10..100, 110..200, ... 510..600."""
    return [[s(i) for i in range(10 * f + 10, 10 * f + 101, 10)] for f in range(0, 60, 10)]


#: Changes to `six_files` touching files 0, 1, 3 and 4, and below and above every file.
SIX_FILE_CHANGES = [
    U(10, s(150, "updated"), (150,)),  # file 1
    D(20, s(320)),  # file 3
    I(30, s(5, "head")),  # below every file: a new first file
    I(40, s(1000, "tail")),  # above every file: a new last file
    I(50, s(205, "gap")),  # between files 1 and 2: joins file 1
    U(60, s(315, "moved"), (30,)),  # key change: file 0 -> file 3
    D(70, s(9999)),  # a delete of a key that is not there
    *[D(100 + i, s(i)) for i in range(410, 501, 10)],  # file 4 loses every row
    I(200, s(470, "back")),
    D(210, s(470)),  # ... and a key comes and goes there
]


@pytest.mark.usefixtures("no_merging")
def test_only_files_holding_changed_keys_are_rewritten(
    spark: Any, tmp_path: Path, engine: Engine
) -> None:
    lake = Lake(spark, tmp_path, SIMPLE, engine)
    files = six_files()
    base = [r for f in files for r in f]
    v1 = lake.publish_files(files)
    assert len(v1["files"]) == 6
    check_layout(lake, v1)
    before = lake.stats(v1)

    changes = SIX_FILE_CHANGES
    v2, rows = lake.apply(changes)
    expected = expected_after(SIMPLE, base, changes)
    assert lake.rows(2) == expected and rows == v2["rows"] == len(expected)
    check_layout(lake, v2)

    shared = [f for f in v2["files"] if f in v1["files"]]
    assert shared == [v1["files"][2], v1["files"][5]], "only files 2 and 5 hold no changed key"
    after = lake.stats(v2)
    assert all(after[f] == before[f] for f in shared), "shared files must not be rewritten"
    new = [f for f in v2["files"] if f not in v1["files"]]
    assert len(new) == 5 and all(f.startswith("data/v000002-") for f in new)  # head, 0, 1, 3, tail
    assert lake.rows(1) == canonical(SIMPLE, base), "version 1 reads exactly as published"
    assert lake.stats(v1) == before


@pytest.mark.usefixtures("no_merging")
def test_both_engines_write_the_same_version(spark: Any, tmp_path: Path) -> None:
    """Spark and pyarrow in the driver, from the same base and changes: the same slots rewritten,
    the same files with the same rows and ranges, file by file."""
    published: dict[str, tuple[Manifest, list[list[Row]]]] = {}
    for engine in ("spark", "local"):
        (tmp_path / engine).mkdir()
        lake = Lake(spark, tmp_path / engine, SIMPLE, engine)
        lake.publish_files(six_files())
        manifest, rows = lake.apply(SIX_FILE_CHANGES)
        assert rows == manifest["rows"]
        plan = layout.read_plan(str(tmp_path / engine / "reconciled-2"))
        assert plan is not None and plan.slots == (-1, 0, 1, 3, 4, 6), plan
        contents = [pq.read_table(lake.dir / f).to_pylist() for f in manifest["files"]]
        published[engine] = manifest, contents
    (spark_v2, spark_rows), (local_v2, local_rows) = published["spark"], published["local"]

    def untagged(
        files: list[str],
    ) -> list[str]:  # each publish attempt names its new files with its own tag
        return [re.sub(r"-[0-9a-f]{8}-", "-", f) for f in files]

    assert untagged(spark_v2["files"]) == untagged(local_v2["files"])
    assert [
        {k: v for k, v in r.items() if k not in ("bytes", "file")} for r in spark_v2["file_ranges"]
    ] == [
        {k: v for k, v in r.items() if k not in ("bytes", "file")} for r in local_v2["file_ranges"]
    ]
    assert spark_rows == local_rows, "each file must hold the same rows in the same order"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_rule_holds_in_both_engines(
    spark: Any, tmp_path: Path, engine: Engine, case: Case
) -> None:
    """Every case of the reconcile rule (tests/integration/test_reconcile.py) as an incremental
    run."""
    lake = Lake(spark, tmp_path, SIMPLE, engine)
    lake.publish_files([sorted(case.base, key=lambda r: r["id"])])
    manifest, rows = lake.apply(case.changes)
    assert (
        lake.rows(2)
        == canonical(SIMPLE, case.expected)
        == expected_after(SIMPLE, case.base, case.changes)
    )
    assert rows == manifest["rows"] == len(case.expected)
    check_layout(lake, manifest)


@pytest.mark.usefixtures("no_merging")
def test_text_keys_follow_the_files_order_not_a_collation(
    spark: Any, tmp_path: Path, engine: Engine
) -> None:
    """Upper case sorts before lower case and 'É' after 'z' in the files (UTF-8 bytes), not as
    utf8mb4_general_ci would; keys must land in the files that order says."""
    lake = Lake(spark, tmp_path, TEXT, engine)
    base = (
        [{"k": f"K{i:03d}", "n": i % 3, "v": "upper"} for i in range(60)]
        + [{"k": f"k{i:03d}", "n": i % 3, "v": "lower"} for i in range(60)]
        + [{"k": f"É{i:03d}", "n": 0, "v": "accent"} for i in range(30)]
    )
    v1 = lake.publish_spark(base)
    assert len(v1["files"]) >= 4
    check_layout(lake, v1)
    before = lake.stats(v1)
    first_max = decode_key(v1["file_ranges"][0]["max_key"])
    assert first_max is not None
    changes = [
        I(10, {"k": "K059x", "n": 1, "v": "after K059"}),  # binary: before every 'k...'
        I(20, {"k": "Zzz", "n": 0, "v": "Z"}),  # binary: before 'k000'; ci: after 'k059'
        U(30, {"k": "K000", "n": 9, "v": "n changed"}, ("K000", 0)),  # second key component changes
        I(40, {"k": "ÉÉ", "n": 0, "v": "last"}),  # above every key
        D(50, {"k": "k030", "n": 0}),
        U(60, {"k": "a", "n": 0, "v": "moved"}, ("É010", 0)),  # from the last file to the middle
        I(70, {"k": "k030", "n": 0, "v": "case twin"}),
        D(80, {"k": "k030", "n": 0}),
    ]
    v2, rows = lake.apply(changes)
    expected = expected_after(TEXT, base, changes)
    assert lake.rows(2) == expected and rows == len(expected)
    check_layout(lake, v2)
    shared = [f for f in v2["files"] if f in v1["files"]]
    assert shared, "some file holds none of the changed keys"
    assert all(lake.stats(v2)[f] == before[f] for f in shared)
    assert lake.rows(1) == canonical(TEXT, base)


@pytest.mark.usefixtures("no_merging")
def test_null_key_components_keep_their_place(spark: Any, tmp_path: Path, engine: Engine) -> None:
    """NULL sorts first, and a NULL key part equals NULL, in both engines (Spark's order and
    <=>)."""
    table = TableInfo(
        "incr",
        "nulls",
        (
            ColumnInfo("a", "int", "int(11)", False),
            ColumnInfo("b", "varchar", "varchar(10)", True),
            ColumnInfo("v", "varchar", "varchar(10)", True),
        ),
        ("a", "b"),
        (),
        0,
    )
    lake = Lake(spark, tmp_path, table, engine)
    files: list[list[Row]] = [
        [{"a": 1, "b": None, "v": "x"}, {"a": 1, "b": "m", "v": "x"}],
        [{"a": 2, "b": None, "v": "x"}, {"a": 2, "b": "b", "v": "x"}],
        [{"a": 3, "b": "a", "v": "x"}],
    ]
    v1 = lake.publish_files(files)
    changes = [
        I(10, {"a": 2, "b": "a", "v": "new"}),
        D(20, {"a": 1, "b": None}),
        U(30, {"a": 0, "b": None, "v": "head"}, (1, "m")),
    ]
    v2, _ = lake.apply(changes)
    assert lake.rows(2) == expected_after(table, [r for f in files for r in f], changes)
    check_layout(lake, v2)
    assert v1["files"][2] in v2["files"] and v1["files"][0] not in v2["files"]


TYPED = TableInfo(
    "incr",
    "typed",
    (
        ColumnInfo("u", "bigint", "bigint(20) unsigned", False, precision=20, scale=0),
        ColumnInfo("d", "datetime", "datetime(6)", False, datetime_precision=6),
        ColumnInfo("ts", "timestamp", "timestamp(6)", False, datetime_precision=6),
        ColumnInfo("t", "time", "time(6)", False, datetime_precision=6),
        ColumnInfo("b", "varbinary", "varbinary(8)", False),
        ColumnInfo("v", "varchar", "varchar(20)", True),
    ),
    ("u", "d", "ts", "t", "b"),
    (),
    0,
)


def typed(u: int, b: bytes, t: int = -5_000_000, v: str = "base", day: int = 1) -> Row:
    return {
        "u": Decimal(u),
        "d": dt.datetime(2024, 1, day, 12, 0, 0, 7),
        "ts": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        "t": t,
        "b": b,
        "v": v,
    }


TYPED_NOT_NULL = TableInfo(
    "incr", "typed_nn", TYPED.columns, ("u", "t", "b"), (), 0
)  # no zero-date parts


@pytest.mark.usefixtures("no_merging")
@pytest.mark.parametrize("table", [TYPED, TYPED_NOT_NULL], ids=["datetime", "not-null"])
def test_keys_of_every_kind_of_type_find_their_file(
    spark: Any, tmp_path: Path, table: TableInfo, engine: Engine
) -> None:
    """BIGINT UNSIGNED (decimal), DATETIME (a nullable key part: zero dates), TIMESTAMP, TIME
    (negative) and VARBINARY key parts, with file boundaries that differ only in the last part."""
    top = 2**64 - 1
    lake = Lake(spark, tmp_path, table, engine)
    files = [
        [typed(1, b"a"), typed(5, b"a", t=-9)],
        [typed(10, b"\x00"), typed(10, b"\x00", t=5)],
        [typed(10, b"\xff", t=5), typed(top - 1, b"")],
        [typed(top, b"\x00\x01")],
    ]
    v1 = lake.publish_files(files)
    changes = [
        I(10, typed(10, b"\x7f", t=5)),  # the gap between files 1 and 2
        I(20, typed(10, b"\xff\x00", t=5)),  # inside file 2 (after b"\xff")
        U(
            30,
            typed(5, b"a", t=-10, v="t moved"),
            tuple(typed(5, b"a", t=-9)[k] for k in table.primary_key),
        ),
        I(40, typed(top, b"\x01")),  # above every key
    ]
    v2, _ = lake.apply(changes)
    assert lake.rows(2) == expected_after(table, [r for f in files for r in f], changes)
    check_layout(lake, v2)
    assert [f for f in v2["files"] if f in v1["files"]] == [v1["files"][3]]
    assert len(v2["files"]) == 5  # files 0, 1 and 2 rewritten, 3 shared, a new last file


NULLABLE_PAIR = TableInfo(
    "incr",
    "pair",
    (
        ColumnInfo("a", "int", "int(11)", False),
        ColumnInfo("b", "varchar", "varchar(10)", True),
        ColumnInfo("v", "varchar", "varchar(20)", True),
    ),
    ("a", "b"),
    (),
    0,
)


def random_history(table: TableInfo, rng: random.Random) -> tuple[list[list[Row]], list[Change]]:
    """Three sorted base files and 60 random changes (inserts in gaps and beyond, updates,
    deletes, key changes, keys that come and go) for a key ``id`` or ``(a, b)``."""

    def row(k: int, tag: str) -> Row:
        if table is SIMPLE:
            return s(k, tag)
        return {"a": k // 3, "b": None if k % 3 == 0 else "xyz"[k % 3], "v": tag}

    def key(r: Row) -> tuple[Any, ...]:
        return tuple(r[k] for k in table.primary_key)

    keys = sorted(rng.sample(range(0, 600, 2), 90))
    files = [[row(k, "base") for k in keys[i : i + 30]] for i in (0, 30, 60)]
    live = {key(r): r for f in files for r in f}
    changes: list[Change] = []
    for pos in range(1, 61):
        k = rng.randrange(-20, 640)
        new = row(k, f"c{pos}")
        kind = rng.random()
        if kind < 0.4:
            changes.append(I(pos, new) if key(new) not in live else U(pos, new, key(new)))
            live[key(new)] = new
        elif kind < 0.6 and live:
            gone = live.pop(rng.choice(sorted(live, key=repr)))
            changes.append(D(pos, gone))
        elif live:
            old = rng.choice(sorted(live, key=repr))
            if key(new) in live and key(new) != old:
                continue
            live.pop(old)
            changes.append(U(pos, new, old))
            live[key(new)] = new
    return files, changes


@pytest.mark.usefixtures("no_merging")
@pytest.mark.parametrize("table", [SIMPLE, NULLABLE_PAIR], ids=["int", "int-and-nullable-text"])
@pytest.mark.parametrize("seed", range(3))
def test_the_driver_merges_changes_across_record_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: TableInfo, seed: int
) -> None:
    """Base files read 4 rows at a time, so changes fall before, inside, between and after record
    batches: the streamed merge equals the table computed in Python (no Spark is started)."""
    monkeypatch.setattr(layout, "BATCH_ROWS", 4)
    files, changes = random_history(table, random.Random(seed))
    lake = Lake(None, tmp_path, table, "local")
    lake.publish_files(files)
    v2, rows = lake.apply(changes)
    expected = expected_after(table, [r for f in files for r in f], changes)
    assert lake.rows(2) == expected and rows == v2["rows"] == len(expected)
    check_layout(lake, v2)


def sparse_files(count: int, rows: int) -> list[list[Row]]:
    """``count`` files of ``rows`` rows, ids 1000 * file + 10 * j (room for inserts between),
    with values that do not compress, so bytes grow with rows."""
    rng = random.Random(3)
    return [
        [s(1000 * f + 10 * j, f"{rng.getrandbits(160):040x}") for j in range(rows)]
        for f in range(count)
    ]


def test_a_rewritten_file_over_twice_the_target_is_split(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(spark, tmp_path, SIMPLE)
    files = sparse_files(4, 100)
    v1 = lake.publish_files(files)
    monkeypatch.setattr(layout, "TARGET_FILE_BYTES", v1["file_ranges"][1]["bytes"])
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 0)
    rng = random.Random(4)
    changes = [
        I(n, s(1000 + 10 * j + off, f"{rng.getrandbits(160):040x}"))
        for n, (j, off) in enumerate(itertools.product(range(100), (3, 5, 7)))
    ]  # file 1: 4x rows
    v2, _ = lake.apply(changes)
    assert lake.rows(2) == expected_after(SIMPLE, [r for f in files for r in f], changes)
    check_layout(lake, v2)
    pieces = [r for r in v2["file_ranges"] if r["file"] not in v1["files"]]
    assert len(pieces) >= 3 and sum(r["rows"] for r in pieces) == 400
    assert max(r["rows"] for r in pieces) - min(r["rows"] for r in pieces) <= 1
    assert [f for f in v2["files"] if f in v1["files"]] == [v1["files"][0], *v1["files"][2:]]


def test_a_tiny_new_file_merges_with_a_small_neighbour(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(spark, tmp_path, SIMPLE)
    files = sparse_files(4, 50)
    base = [r for f in files for r in f]
    v1 = lake.publish_files(files)
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 2 * max(r["bytes"] for r in v1["file_ranges"]))
    tail = [I(n, s(10_000 + n, "tail")) for n in range(3)]
    v2, _ = lake.apply(tail)
    assert lake.rows(2) == expected_after(SIMPLE, base, tail)
    check_layout(lake, v2)
    # Shared small files are never merged with each other; the new tail joins the last one.
    assert v2["files"][:3] == v1["files"][:3] and len(v2["files"]) == 4
    assert v2["file_ranges"][3]["rows"] == 53 and v2["files"][3].startswith("data/v000002-")
    # The next run's tail merges again, into the (new, still small) last file.
    more = [I(10 + n, s(20_000 + n, "tail 2")) for n in range(2)]
    v3, _ = lake.apply(more)
    assert lake.rows(3) == expected_after(SIMPLE, base, tail + more)
    assert v3["files"][:3] == v1["files"][:3] and v3["file_ranges"][3]["rows"] == 55


def test_no_changes_publish_no_version(spark: Any, tmp_path: Path) -> None:
    lake = Lake(spark, tmp_path, SIMPLE)
    v1 = lake.publish_files(sparse_files(3, 10))
    before = lake.stats(v1)
    same, rows = lake.apply([])
    assert same == v1 and rows == 30 and lake.stats(v1) == before
    assert sorted(p.name for p in (lake.dir / "_tidemark" / "versions").iterdir()) == [
        "000001.json"
    ]
    changes = [U(1, s(0, "changed"), (0,))]
    v2, _ = lake.apply(changes)
    assert v2["version"] == 2 and lake.rows(2) == expected_after(
        SIMPLE, [r for f in sparse_files(3, 10) for r in f], changes
    )


def test_a_version_without_file_ranges_is_rewritten_whole_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = Lake(spark, tmp_path, SIMPLE)
    files = sparse_files(3, 10)
    v1 = lake.publish_files(files)
    for path in (
        lake.dir / "_tidemark" / "current.json",
        lake.dir / "_tidemark" / "versions" / "000001.json",
    ):
        legacy = {k: v for k, v in v1.items() if k != "file_ranges"}
        path.write_text(json.dumps(legacy))
    changes = [U(1, s(1000, "changed"), (1000,))]
    monkeypatch.setattr(layout, "TARGET_FILE_BYTES", 1)  # the whole rewrite makes many files
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 0)
    v2, _ = lake.apply(changes)
    assert not set(v2["files"]) & set(v1["files"]) and len(v2["files"]) > 1
    assert lake.rows(2) == expected_after(SIMPLE, [r for f in files for r in f], changes)
    check_layout(lake, v2)
    v3, _ = lake.apply([D(2, s(0))])
    assert set(v3["files"]) & set(v2["files"]), "from now on files are shared"


def test_an_emptied_table_and_an_empty_base(spark: Any, tmp_path: Path, engine: Engine) -> None:
    lake = Lake(spark, tmp_path, SIMPLE, engine)
    v1 = lake.publish_files([[s(10)], [s(20)]])
    v2, rows = lake.apply([D(1, s(10)), D(2, s(20))])
    assert rows == v2["rows"] == 0 and len(v2["files"]) == 1 and lake.rows(2) == []
    v3, rows = lake.apply([I(3, s(7, "again"))])
    assert rows == 1 and lake.rows(3) == canonical(SIMPLE, [s(7, "again")])
    check_layout(lake, v3)
    assert lake.rows(1) == canonical(SIMPLE, [s(10), s(20)]) and v1["files"][0] not in v3["files"]


def test_retention_keeps_every_file_a_retained_version_reads(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 0)
    lake = Lake(spark, tmp_path, SIMPLE, keep_versions=2, keep_hours=0)
    files = sparse_files(4, 10)
    table = [r for f in files for r in f]
    first = lake.publish_files(files)
    history = {1: canonical(SIMPLE, table)}
    steps = [
        [U(1, s(0, "a"), (0,))],
        [U(2, s(3000, "b"), (3000,))],
        [D(3, s(1010))],
        [I(4, s(15, "c"))],
    ]
    for n, changes in enumerate(steps, start=2):
        lake.apply(changes)
        table = expected_after(SIMPLE, table, changes)
        history[n] = table
        kept = sorted(int(p.stem) for p in (lake.dir / "_tidemark" / "versions").iterdir())
        assert kept == [n - 1, n]
        for version in kept:
            assert lake.rows(version) == history[version], (
                f"version {version} must read as published"
            )
        referenced = {f for v in kept for f in lake.manifest(v)["files"]}
        on_disk = {f"data/{p.name}" for p in (lake.dir / "data").iterdir()}
        assert on_disk == referenced, "retention drops exactly the files no kept version reads"
    assert lake.manifest(5)["files"][2] == first["files"][2], (
        "a file no run changed outlives its version"
    )
    assert (lake.dir / first["files"][2]).exists()


# ----------------------------------------------------------------------------- the engine


ITEMS = """CREATE TABLE {db}.items (
  id INT NOT NULL PRIMARY KEY, name VARCHAR(60) NOT NULL, price DECIMAL(10, 2), at DATETIME(6)
) ENGINE=InnoDB"""
TAGS = """CREATE TABLE {db}.tags (
  tag VARCHAR(40) NOT NULL PRIMARY KEY, n INT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"""


def _published_state(
    config: Any, name: str
) -> tuple[Manifest, dict[str, tuple[int, int]], list[Row]]:
    tdir = Path(table_dir(config, name))
    manifest: Manifest = json.loads((tdir / "_tidemark" / "current.json").read_text())
    stats = {f: _stat(tdir / f) for f in manifest["files"]}
    rows = (
        ds.dataset([str(tdir / f) for f in manifest["files"]], format="parquet")
        .to_table()
        .to_pylist()
    )
    return manifest, stats, sorted(rows, key=repr)


@pytest.mark.parametrize("rewrite", ["local", "spark"])
def test_engine_runs_share_unchanged_files(
    mariadb: LocalMariaDB,
    tmp_path: Path,
    rewrite: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`tidemark run` twice, with inserts (inside and beyond the range), updates, deletes and
    key changes between: the second run rewrites the files those keys live in, nothing else."""
    db = f"incr_engine_{rewrite}"
    if rewrite == "spark":
        monkeypatch.setattr(
            reconcile, "LOCAL_CHANGES_BYTES", 0
        )  # every change set is "too big" for the driver
    mariadb.execute(f"CREATE DATABASE {db}")
    mariadb.execute(
        ITEMS.format(db=db),
        TAGS.format(db=db),
        f"INSERT INTO {db}.items SELECT seq * 10, CONCAT('item ', seq, ' ', MD5(seq)), seq / 7,"
        f" TIMESTAMP('2024-01-01') + INTERVAL seq MINUTE FROM seq_1_to_20000",
        f"INSERT INTO {db}.tags SELECT CONCAT(ELT(seq % 3 + 1, 'Tag', 'tag', 'Étag'),"
        " LPAD(seq, 5, '0')),"
        f" seq FROM seq_1_to_30000",
        database=db,
    )
    monkeypatch.setattr(layout, "TARGET_FILE_BYTES", 64 * 1024)  # several files from small tables
    monkeypatch.setattr(layout, "SMALL_FILE_BYTES", 8 * 1024)
    tables = [f"{db}.items", f"{db}.tags"]
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name=f"incr_{rewrite}",
            defaults={"chunk_size": 4000, "batch_chunks": 2, "read_margin_seconds": 0.0},
        ),
    )
    config = load_config(config_path)
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    first = {t: _published_state(config, t) for t in tables}
    assert len(first[f"{db}.items"][0]["files"]) >= 4 and len(first[f"{db}.tags"][0]["files"]) >= 2

    mariadb.execute(
        "UPDATE items SET price = price + 1, name = 'updated' WHERE id BETWEEN 1000 AND 1500",
        "DELETE FROM items WHERE id BETWEEN 1600 AND 1700",
        "INSERT INTO items VALUES (1003, 'inside', 1, NOW(6)), (999995, 'beyond', 2, NOW(6))",
        "UPDATE items SET id = 1505 WHERE id = 30",  # moves within the first files
        "UPDATE items SET id = 500005 WHERE id = 2000",  # moves beyond the range
        "UPDATE tags SET n = -n WHERE tag LIKE 'Tag0001%'",
        "UPDATE tags SET tag = 'TAG00012' WHERE tag = 'Tag00012'",  # only the case changes
        "INSERT INTO tags VALUES ('Zz', 1), ('éé', 2)",
        database=db,
    )
    caplog.set_level(logging.INFO, logger="orchestrator.pipeline.reconcile.rewrite")
    caplog.clear()
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    used = "the driver (pyarrow) rewrote" if rewrite == "local" else "Spark rewrote"
    assert sum(used in r.getMessage() for r in caplog.records) == 2, [
        r.getMessage() for r in caplog.records
    ]

    assert_lake_equals_source(config, mariadb, tables)
    items_v1, items_stats, _ = first[f"{db}.items"]
    items_v2, stats_now, _ = _published_state(config, f"{db}.items")
    assert items_v2["version"] == 2
    shared = [f for f in items_v2["files"] if f in items_v1["files"]]
    assert shared and len(shared) < len(items_v1["files"]), (items_v1["files"], items_v2["files"])
    assert all(stats_now[f] == items_stats[f] for f in shared)
    rewritten = sum(
        r["rows"] for r in items_v2["file_ranges"] if r["file"] not in items_v1["files"]
    )
    assert rewritten < items_v2["rows"] // 2
    for name, (manifest, stats, rows) in first.items():
        tdir = Path(table_dir(config, name))
        old = json.loads((tdir / "_tidemark" / "versions" / "000001.json").read_text())
        assert old == manifest
        again = (
            ds.dataset([str(tdir / f) for f in old["files"]], format="parquet")
            .to_table()
            .to_pylist()
        )
        assert sorted(again, key=repr) == rows, f"{name}: version 1 must read as it was published"
        assert {f: _stat(tdir / f) for f in old["files"]} == stats
