"""Strategy choice and the index walk, run against SQLite (a real SQL engine, in memory).

Only integer keys here: SQLite has no MySQL string escapes or typed temporal
literals. Text, temporal and composite keys are covered against MariaDB in
tests/integration/test_planning.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunking import (
    ChunkingError,
    KeyRange,
    TablePlan,
    choose_strategy,
    chunk_predicate,
    plan_key_space,
)
from chunking.splitter import CountingQuery, open_splitter
from chunking.uneven import UnevenSplitter


class Lite:
    """An in-memory SQLite database ``d`` holding one table ``d.t`` with an integer key."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:")
        self.conn.execute("ATTACH ':memory:' AS d")
        self.statements: list[str] = []

    def load(self, keys: Sequence[int], columns: int = 1) -> None:
        names = ", ".join(f"k{i} INTEGER NOT NULL" for i in range(columns))
        pk = ", ".join(f"k{i}" for i in range(columns))
        self.conn.execute("DROP TABLE IF EXISTS d.t")
        self.conn.execute(f"CREATE TABLE d.t ({names}, PRIMARY KEY ({pk}))")
        marks = ", ".join("?" * columns)
        rows = [(k,) if columns == 1 else tuple(k) for k in keys]  # type: ignore[arg-type]
        self.conn.executemany(f"INSERT INTO d.t VALUES ({marks})", rows)

    def __call__(self, sql: str, /) -> list[tuple[Any, ...]]:
        self.statements.append(sql)
        return self.conn.execute(sql).fetchall()

    def chunk_counts(self, plan: TablePlan) -> list[int]:
        counts = []
        for c in plan.chunks:
            pred = chunk_predicate(plan.chunk_key, c.range)
            counts.append(self.conn.execute(f"SELECT COUNT(*) FROM d.t WHERE {pred}").fetchone()[0])
        return counts


@pytest.fixture
def lite() -> Iterator[Lite]:
    db = Lite()
    yield db
    db.conn.close()


def plan(lite: Lite, chunk_size: int, key: Sequence[str] = ("k0",), **kw: Any) -> TablePlan:
    return plan_key_space(lite, "d.t", list(key), ["bigint"] * len(key), chunk_size, **kw)


def test_empty_table_has_no_chunks(lite: Lite) -> None:
    lite.load([])
    result = plan(lite, 10)
    assert result.strategy == "empty" and result.chunks == ()
    assert result.stats["rows"] == 0 and result.stats["queries"] == 1


def test_dense_key_is_even_with_no_query_per_chunk(lite: Lite) -> None:
    lite.load(range(1, 1001))
    result = plan(lite, 100)
    assert result.strategy == "even"
    assert len(result.chunks) == 10
    assert result.stats["queries"] == 2  # min and max, COUNT(*) (the estimate was 0)
    assert lite.chunk_counts(result) == [100] * 10


def test_a_large_estimate_is_trusted_without_counting(lite: Lite) -> None:
    lite.load(range(1, 1001))
    result = plan(lite, 100, row_estimate=1000, exact_count_below=500)
    assert result.strategy == "even" and result.stats["queries"] == 1
    assert result.stats["rows_exact"] is False


def test_sparse_key_walks_the_index(lite: Lite) -> None:
    keys = [*range(1, 301), *(10**12 + 7 * i for i in range(250))]
    lite.load(keys)
    result = plan(lite, 50)
    assert result.strategy == "uneven"
    assert "outside" in result.stats["reason"]
    assert lite.chunk_counts(result) == [50] * 11
    assert result.stats["rows"] == 550 and result.stats["rows_exact"]
    # bounds (1) + count (1) + one walk per chunk boundary (10) + the final empty walk (1) + tail
    # count (1)
    assert result.stats["queries"] == 14


@pytest.mark.parametrize(
    ("rows", "chunk_size", "sizes"),
    [
        (9, 4, [4, 5]),  # a tail of 1 < 4/2 joins the chunk before it
        (10, 4, [4, 4, 2]),  # a tail of 2 >= 4/2 stays on its own
        (3, 4, [3]),  # smaller than one chunk
        (8, 4, [4, 4]),  # the last walk finds nothing past the 8th key
        (9, 1, [1] * 9),  # the tail is the max key alone
        (2, 1, [1, 1]),
    ],
)
def test_tail_handling(lite: Lite, rows: int, chunk_size: int, sizes: list[int]) -> None:
    lite.load([10**9 * i for i in range(rows)])  # sparse, so uneven
    result = plan(lite, chunk_size)
    assert result.strategy == "uneven"
    assert lite.chunk_counts(result) == sizes
    assert [c.estimated_rows for c in result.chunks] == sizes


def test_a_clearly_sparse_estimate_skips_the_count(lite: Lite) -> None:
    lite.load([10**9 * i for i in range(100)])
    result = plan(
        lite, 10, row_estimate=80
    )  # the estimate is off, but not by the 10**7 that matters
    assert result.strategy == "uneven" and "(estimated rows)" in result.stats["reason"]
    assert not any(
        sql.startswith("SELECT COUNT(*) FROM `d`.`t`") and "WHERE" not in sql
        for sql in lite.statements
    )
    assert lite.chunk_counts(result) == [10] * 10
    lite.statements.clear()
    dense = plan(lite, 10, row_estimate=80, factor_bounds=(0.05, 1e9))
    assert dense.strategy == "even"
    assert (
        "SELECT COUNT(*) FROM `d`.`t`" in lite.statements
    )  # within bounds: the small estimate is replaced


def test_composite_integer_key(lite: Lite) -> None:
    keys = [(a, b) for a in (1, 2, 3) for b in range(40)] + [(9, b) for b in range(200)]
    lite.load(keys, columns=2)  # type: ignore[arg-type]
    result = plan(lite, 37, key=("k0", "k1"))
    assert result.strategy == "uneven" and "composite" in result.stats["reason"]
    counts = lite.chunk_counts(result)
    assert sum(counts) == len(keys)
    assert all(c == 37 for c in counts[:-1]) and 37 / 2 <= counts[-1] <= 1.5 * 37


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=400),
    st.integers(min_value=1, max_value=120),
)
def test_any_key_set_is_partitioned(keys: set[int], chunk_size: int) -> None:
    lite = Lite()
    lite.load(sorted(keys))
    result = plan(lite, chunk_size)
    counts = lite.chunk_counts(result)
    assert sum(counts) == len(keys)
    if result.chunks:
        assert result.chunks[0].range.start is None
        last = result.chunks[-1].range
        assert last.end == (max(keys),) and last.end_inclusive
    for a, b in zip(result.chunks, result.chunks[1:], strict=False):
        assert a.range.end == b.range.start and not a.range.end_inclusive
    if result.strategy == "uneven":
        assert all(n == chunk_size for n in counts[:-1])
        assert counts[-1] <= 1.5 * chunk_size
        assert len(counts) == 1 or counts[-1] >= chunk_size / 2


def test_splitter_is_lazy(lite: Lite) -> None:
    lite.load([10**9 * i for i in range(100)])
    counting = CountingQuery(lite)
    splitter = UnevenSplitter(counting, "d.t", ("k0",), (99 * 10**9,), 10)
    chunks = splitter.chunks()
    next(chunks)
    assert counting.count == 2  # the first chunk is known once the second boundary is
    rest = list(chunks)
    assert len(rest) == 9


def test_open_splitter_reports_the_decision(lite: Lite) -> None:
    lite.load(range(0, 10_000, 10))
    splitter, stats = open_splitter(lite, "d.t", ["k0"], ["int"], 100, factor_bounds=(0.05, 5.0))
    assert splitter is not None and splitter.strategy == "uneven"
    assert stats["factor"] == pytest.approx(9.991)
    assert stats["min"] == [0] and stats["max"] == [9990]
    splitter, stats = open_splitter(lite, "d.t", ["k0"], ["int"], 100, factor_bounds=(0.05, 10.0))
    assert splitter is not None and splitter.strategy == "even"


def test_choose_strategy_bounds() -> None:
    assert choose_strategy(1, 100, 100, True, (1.0, 1.0)).strategy == "even"
    assert choose_strategy(1, 100, 99, True, (1.0, 1.0)).strategy == "uneven"
    assert (
        choose_strategy(1, 100, 1000, False, (0.05, 100.0)).strategy == "even"
    )  # stale high estimate
    assert choose_strategy(1, 100, 10_000, False, (0.05, 100.0)).strategy == "uneven"


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        (["enum"], "ENUM"),
        (["bit"], "BIT"),
        (["int", "int"], "column types"),
        ([], "column types"),
    ],
)
def test_unplannable_keys(lite: Lite, columns: list[str], match: str) -> None:
    lite.load([1])
    with pytest.raises(ChunkingError, match=match):
        plan_key_space(lite, "d.t", ["k0"], columns, 10)


def test_rows_inserted_after_planning_above_max_are_in_no_chunk(lite: Lite) -> None:
    lite.load(range(100))
    result = plan(lite, 10)
    lite.conn.execute("INSERT INTO d.t VALUES (100), (-5)")
    counts = lite.chunk_counts(result)
    assert sum(counts) == 101  # -5 (below min) is in the first chunk; 100 (above max) in none
    assert result.chunks[0].range.contains((-5,))
    assert not any(c.range.contains((100,)) for c in result.chunks)
    assert KeyRange.through(None, (99,)).contains((-5,))
