"""Reconcile on a real local Spark: the last change per key wins (docs/design.md, "Why it is
correct")."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.pipeline.reconcile.spark import reconcile_table
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import staging_schema

pytestmark = pytest.mark.integration

SIMPLE = TableInfo(
    "spk_rec",
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

COMPOSITE = TableInfo(
    "spk_rec",
    "composite",
    (
        ColumnInfo("a", "int", "int(11)", False),
        ColumnInfo("b", "varchar", "varchar(10)", True),
        ColumnInfo("v", "varchar", "varchar(20)", True),
    ),
    ("a", "b"),
    (),
    0,
)


@dataclass
class Change:
    """One row change: position, op, the row image, and the old key for 'U'/'D'."""

    pos: int
    op: str
    row: dict[str, Any]
    old: tuple[Any, ...] | None = None
    file: int = 1
    row_index: int = 0


def I(pos: int, row: dict[str, Any], **kw: Any) -> Change:  # noqa: E743 - reads like the op
    return Change(pos, "I", row, None, **kw)


def U(pos: int, row: dict[str, Any], old: tuple[Any, ...], **kw: Any) -> Change:
    return Change(pos, "U", row, old, **kw)


def D(pos: int, row: dict[str, Any], **kw: Any) -> Change:
    return Change(pos, "D", row, None, **kw)


def change_schema(table: TableInfo) -> pa.Schema:
    staged = staging_schema(table.columns)
    fields = [pa.field(n, pa.int64()) for n in ("_tm_file", "_tm_pos", "_tm_row")]
    fields.append(pa.field("_tm_op", pa.string()))
    fields.extend(pa.field(f.name, f.type) for f in staged)
    fields.extend(pa.field(f"_tm_old_{k}", staged.field(k).type) for k in table.primary_key)
    return pa.schema(fields)


def full_row(table: TableInfo, row: dict[str, Any]) -> dict[str, Any]:
    return {c.name: row.get(c.name) for c in table.columns}


def write_changes(
    directory: Path, table: TableInfo, changes: Sequence[Change], files: int = 2
) -> None:
    """The binlog side's change segments, split across ``files`` files in the given order."""
    directory.mkdir(parents=True, exist_ok=True)
    key = table.primary_key
    records = []
    for c in changes:
        row = full_row(table, c.row)
        old = c.old if c.op == "U" else (tuple(row[k] for k in key) if c.op == "D" else None)
        record = {
            "_tm_file": c.file,
            "_tm_pos": c.pos,
            "_tm_row": c.row_index,
            "_tm_op": c.op,
            **row,
        }
        record.update({f"_tm_old_{k}": (old[i] if old else None) for i, k in enumerate(key)})
        records.append(record)
    schema = change_schema(table)
    for n in range(files):
        part = records[n::files]
        pq.write_table(
            pa.Table.from_pylist(part, schema=schema), directory / f"seg-{n:06d}.parquet"
        )


def write_base(
    directory: Path, table: TableInfo, rows: Sequence[dict[str, Any]], chunks: int = 2
) -> list[str]:
    """Snapshot chunk dirs in staging types."""
    schema = pa.schema(pa.field(f.name, f.type) for f in staging_schema(table.columns))
    paths = []
    for n in range(chunks):
        chunk = directory / f"chunk-{n:06d}"
        chunk.mkdir(parents=True)
        part = [full_row(table, r) for r in rows[n::chunks]]
        pq.write_table(pa.Table.from_pylist(part, schema=schema), chunk / "part-00000.parquet")
        paths.append(str(chunk))
    return paths


def read_rows(directory: Path) -> list[dict[str, Any]]:
    files = sorted(directory.glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def by_key(
    table: TableInfo, rows: Sequence[dict[str, Any]]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in table.primary_key): full_row(table, r) for r in rows}


def r(id: int, v: str | None = None, t: int | None = None) -> dict[str, Any]:
    return {"id": id, "v": v, "t": t}


BASE = [r(1, "a", -1), r(2, "b", 90_000_000_001), r(3, "c")]


@dataclass
class Case:
    name: str
    changes: list[Change]
    expected: list[dict[str, Any]]
    base: list[dict[str, Any]] = field(default_factory=lambda: list(BASE))


CASES = [
    Case("insert", [I(10, r(4, "d"))], [*BASE, r(4, "d")]),
    Case("update", [U(10, r(2, "B", 5), (2,))], [BASE[0], r(2, "B", 5), BASE[2]]),
    Case("delete", [D(10, r(2, "b"))], [BASE[0], BASE[2]]),
    Case(
        "delete then reinsert", [D(10, r(2, "b")), I(20, r(2, "z"))], [BASE[0], r(2, "z"), BASE[2]]
    ),
    Case("insert then delete, listed backwards", [D(20, r(5, "x")), I(10, r(5, "x"))], BASE),
    Case(
        "last of several updates wins",
        [U(30, r(1, "z"), (1,)), U(10, r(1, "x"), (1,)), U(20, r(1, "y"), (1,))],
        [r(1, "z"), *BASE[1:]],
    ),
    Case("key change", [U(10, r(7, "a", -1), (1,))], [*BASE[1:], r(7, "a", -1)]),
    Case(
        "key change then back",
        [U(10, r(7, "a"), (1,)), U(20, r(1, "q"), (7,))],
        [r(1, "q"), *BASE[1:]],
    ),
    Case(
        "key change then delete of the new key",
        [U(10, r(7, "a"), (1,)), D(20, r(7, "a"))],
        BASE[1:],
    ),
    Case(
        "shift all keys in one statement (row order)",
        [
            U(10, r(4, "c"), (3,), row_index=0),
            U(10, r(3, "b"), (2,), row_index=1),
            U(10, r(2, "a"), (1,), row_index=2),
        ],
        [r(2, "a"), r(3, "b"), r(4, "c")],
        base=[r(1, "a"), r(2, "b"), r(3, "c")],
    ),
    Case(
        "changes to keys not in the base",
        [D(10, r(9, "gone")), U(20, r(8, "n"), (8,))],
        [*BASE, r(8, "n")],
    ),
    Case(
        "binlog file index outranks offset",
        [U(5, r(1, "new"), (1,), file=2), U(999, r(1, "old"), (1,), file=1)],
        [r(1, "new"), *BASE[1:]],
    ),
    Case(
        "empty base",
        [I(1, r(1, "x")), I(2, r(2, "y")), D(3, r(2, "y")), U(4, r(3, "z"), (1,))],
        [r(3, "z")],
        base=[],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_last_change_per_key_wins(spark: Any, tmp_path: Path, case: Case) -> None:
    base = write_base(tmp_path / "base", SIMPLE, case.base) if case.base else []
    write_changes(tmp_path / "changes", SIMPLE, case.changes)
    rows = reconcile_table(
        spark, SIMPLE, ("id",), base, str(tmp_path / "changes"), str(tmp_path / "out")
    )
    got = read_rows(tmp_path / "out")
    assert rows == len(got) == len(case.expected)
    assert by_key(SIMPLE, got) == by_key(SIMPLE, case.expected)
    assert [x["id"] for x in got] == sorted(x["id"] for x in got)


@pytest.mark.parametrize("changes_dir", ["missing", "empty"])
def test_no_changes_keeps_the_base(spark: Any, tmp_path: Path, changes_dir: str) -> None:
    if changes_dir == "empty":
        (tmp_path / changes_dir).mkdir()
    base = write_base(tmp_path / "base", SIMPLE, BASE)
    rows = reconcile_table(
        spark, SIMPLE, ("id",), base, str(tmp_path / changes_dir), str(tmp_path / "out")
    )
    got = read_rows(tmp_path / "out")
    assert rows == 3 and got == [full_row(SIMPLE, x) for x in BASE]
    schema = pq.read_schema(sorted((tmp_path / "out").glob("*.parquet"))[0])
    assert [f.type for f in schema] == [f.type for f in staging_schema(SIMPLE.columns)]


def test_empty_base_and_no_changes(spark: Any, tmp_path: Path) -> None:
    rows = reconcile_table(
        spark, SIMPLE, ("id",), [], str(tmp_path / "none"), str(tmp_path / "out")
    )
    assert rows == 0 and read_rows(tmp_path / "out") == []


def c(a: int, b: str | None, v: str) -> dict[str, Any]:
    return {"a": a, "b": b, "v": v}


def test_composite_key(spark: Any, tmp_path: Path) -> None:
    base = write_base(
        tmp_path / "base",
        COMPOSITE,
        [c(1, "x", "a"), c(1, "y", "b"), c(2, "x", "c"), c(3, "x", "d")],
    )
    write_changes(
        tmp_path / "changes",
        COMPOSITE,
        [
            U(10, c(1, "z", "b2"), (1, "y")),  # second component changes
            D(20, c(2, "x", "c")),  # (2, x) only, not (1, x) nor (3, x)
            I(30, c(2, "y", "e")),
            U(40, c(3, "x", "d2"), (3, "x")),
        ],
    )
    rows = reconcile_table(
        spark, COMPOSITE, ("a", "b"), base, str(tmp_path / "changes"), str(tmp_path / "out")
    )
    got = read_rows(tmp_path / "out")
    assert rows == 4
    assert by_key(COMPOSITE, got) == by_key(
        COMPOSITE, [c(1, "x", "a"), c(1, "z", "b2"), c(2, "y", "e"), c(3, "x", "d2")]
    )
    assert [(x["a"], x["b"]) for x in got] == sorted((x["a"], x["b"]) for x in got)


def test_null_key_component_compares_null_safe(spark: Any, tmp_path: Path) -> None:
    base = write_base(
        tmp_path / "base", COMPOSITE, [c(1, None, "n"), c(1, "1", "o"), c(2, None, "p")]
    )
    write_changes(
        tmp_path / "changes",
        COMPOSITE,
        [
            D(10, c(1, None, "n")),
            U(20, c(2, None, "p2"), (2, None)),
            U(30, c(5, None, "q"), (1, "1")),
        ],
    )
    reconcile_table(
        spark, COMPOSITE, ("a", "b"), base, str(tmp_path / "changes"), str(tmp_path / "out")
    )
    got = read_rows(tmp_path / "out")
    assert by_key(COMPOSITE, got) == by_key(COMPOSITE, [c(2, None, "p2"), c(5, None, "q")])


def test_output_is_range_partitioned_by_key(spark: Any, tmp_path: Path) -> None:
    rows = [r(i, f"v{i}") for i in range(1, 301)]
    base = write_base(tmp_path / "base", SIMPLE, rows, chunks=3)
    write_changes(tmp_path / "changes", SIMPLE, [D(1, r(150)), I(2, r(1000, "new"))])
    count = reconcile_table(
        spark,
        SIMPLE,
        ("id",),
        base,
        str(tmp_path / "changes"),
        str(tmp_path / "out"),
        target_file_bytes=1,
    )
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert count == 300 and 1 < len(files) <= 4 * spark.sparkContext.defaultParallelism
    ranges = []
    for f in files:
        ids = pq.read_table(f).column("id").to_pylist()
        if ids:
            assert ids == sorted(ids)
            ranges.append((ids[0], ids[-1]))
    assert ranges == sorted(ranges) and all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    assert 150 not in {x["id"] for x in read_rows(tmp_path / "out")}
