"""Choosing a strategy and planning a table's key space.

The flow, per table: read the smallest and largest key (two index dives, one statement);
for a single integer key get the row count (the server's estimate, or an
exact ``COUNT(*)`` when the estimate is small and so cheap to replace, unless
even the estimate shows the key is far too sparse) and compute the
distribution factor ``(max - min + 1) / rows``; inside the configured bounds
the even strategy splits by arithmetic, otherwise (and for every other key)
the uneven strategy walks the index.

`open_splitter` returns a lazy `Splitter` (chunks are found as they are
consumed); `plan_key_space` runs it to the end and returns a `TablePlan`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chunking import mysql
from chunking.even import EvenSplitter
from chunking.keys import Key, encode_key
from chunking.mysql import ColumnLike, Query
from chunking.ranges import Chunk, KeyRange, Strategy, TablePlan
from chunking.uneven import UnevenSplitter
from orchestrator.schema.families import FAMILIES

#: Below this many estimated rows the estimate is replaced by an exact COUNT(*):
#: InnoDB's TABLE_ROWS is often 0 or stale for small and freshly loaded tables.
EXACT_COUNT_BELOW = 1_000_000

#: A small table whose estimated distribution factor exceeds the even bound by
#: this much is planned uneven without counting it first.
CLEARLY_SPARSE = 4.0


class ChunkingError(ValueError):
    """A table's key cannot be planned as given (an unsupported type, a mismatched key)."""


class Splitter(Protocol):
    """Yields a table's chunks in key order, lazily."""

    @property
    def strategy(self) -> str: ...

    def chunks(self) -> Iterator[Chunk]: ...


class CountingQuery:
    """A `Query` that counts the statements it runs (``count``)."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.count = 0

    def __call__(self, sql: str, /) -> Sequence[Sequence[Any]]:
        self.count += 1
        return self.query(sql)


@dataclass(frozen=True, slots=True)
class Decision:
    """A strategy and the numbers it was chosen on."""

    strategy: Strategy
    reason: str
    rows: int | None = None
    rows_exact: bool = False
    factor: float | None = None


def distribution_factor(low: int, high: int, rows: int) -> float:
    """Key values per row: 1.0 for a gapless key, larger for a sparse one.

    >>> distribution_factor(1, 9_000_000, 2_800_000)
    3.2142857142857144
    >>> distribution_factor(5, 5, 1)
    1.0
    """
    return (high - low + 1) / rows if rows > 0 else float("inf")


def choose_strategy(
    low: int, high: int, rows: int, rows_exact: bool, factor_bounds: tuple[float, float]
) -> Decision:
    """Even when the distribution factor is within ``factor_bounds``, else uneven.

    >>> choose_strategy(1, 1000, 1000, True, (0.05, 100.0)).strategy
    'even'
    >>> d = choose_strategy(1, 10**12, 2000, True, (0.05, 100.0))
    >>> d.strategy, d.reason
    ('uneven', 'distribution factor 5e+08 is outside [0.05, 100.0]')
    >>> choose_strategy(1, 10, 0, False, (0.05, 100.0)).reason
    'no row count'
    """
    if rows <= 0:
        return Decision("uneven", "no row count", rows, rows_exact)
    factor = distribution_factor(low, high, rows)
    lower, upper = factor_bounds
    if lower <= factor <= upper:
        return Decision(
            "even",
            f"distribution factor {factor:.4g} is within [{lower}, {upper}]",
            rows,
            rows_exact,
            factor,
        )
    return Decision(
        "uneven",
        f"distribution factor {factor:.4g} is outside [{lower}, {upper}]",
        rows,
        rows_exact,
        factor,
    )


def read_bounds(query: Query, table: str, chunk_key: Sequence[str]) -> tuple[Key, Key] | None:
    """The smallest and largest key (one query), or None for an empty table."""
    rows = sorted(query(mysql.edge_keys_sql(table, chunk_key)), key=lambda row: int(row[0]))
    if not rows:
        return None
    return tuple(rows[0][1:]), tuple(rows[-1][1:])


def _data_types(columns: Sequence[ColumnLike | str]) -> list[str]:
    return [(c if isinstance(c, str) else c.data_type).lower() for c in columns]


def _as_int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ChunkingError(f"an integer key column returned {type(value).__name__} {value!r}")
    return value


def _key_kind(chunk_key: Sequence[str], data_types: Sequence[str]) -> str:
    if len(chunk_key) > 1:
        return f"composite key ({', '.join(chunk_key)})"
    return f"{data_types[0]} key"


def open_splitter(
    query: Query,
    table: str,
    chunk_key: Sequence[str],
    columns: Sequence[ColumnLike | str],
    chunk_size: int,
    *,
    row_estimate: int = 0,
    factor_bounds: tuple[float, float] = (0.05, 100.0),
    exact_count_below: int = EXACT_COUNT_BELOW,
) -> tuple[Splitter | None, dict[str, Any]]:
    """Read the key bounds, choose a strategy and return its (lazy) splitter.

    Args:
        query: runs SQL text and returns rows.
        table: ``db.table``.
        chunk_key: a unique NOT NULL key's columns, in index order.
        columns: the key columns' descriptions or data types, in the same order.
        chunk_size: target rows per chunk.
        row_estimate: the server's estimate (``information_schema.TABLES.TABLE_ROWS``).
        factor_bounds: the distribution factors for which the even strategy is used.
        exact_count_below: estimates below this are replaced by ``COUNT(*)``.

    Returns:
        The splitter (None for an empty table) and the decision's numbers.

    Raises:
        ChunkingError: a key column's type cannot be chunked, or the key's arity is wrong.
    """
    data_types = _data_types(columns)
    if not chunk_key or len(data_types) != len(chunk_key):
        raise ChunkingError(
            f"{table}: {len(data_types)} column types for chunk key {list(chunk_key)}"
        )
    for name, data_type, column in zip(chunk_key, data_types, columns, strict=True):
        reason = mysql.unsupported_key_reason(data_type, getattr(column, "collation", None))
        if reason:
            raise ChunkingError(f"{table}: chunk-key column `{name}` cannot be chunked: {reason}")
    stats: dict[str, Any] = {"chunk_size": chunk_size, "row_estimate": row_estimate}
    bounds = read_bounds(query, table, chunk_key)
    if bounds is None:
        stats.update(min=None, max=None, rows=0, rows_exact=True, factor=None, reason="no rows")
        return None, {**stats, "strategy": "empty"}
    low, high = bounds
    mysql.check_key(data_types, low)
    mysql.check_key(data_types, high)
    stats.update(min=encode_key(low), max=encode_key(high))
    decision = _decide(
        query,
        table,
        chunk_key,
        data_types,
        low,
        high,
        row_estimate,
        factor_bounds,
        exact_count_below,
    )
    stats.update(
        strategy=decision.strategy,
        reason=decision.reason,
        rows=decision.rows,
        rows_exact=decision.rows_exact,
        factor=decision.factor,
    )
    if decision.strategy == "even" and decision.rows is not None:
        return EvenSplitter(_as_int(low[0]), _as_int(high[0]), decision.rows, chunk_size), stats
    return UnevenSplitter(query, table, tuple(chunk_key), high, chunk_size), stats


def _decide(
    query: Query,
    table: str,
    chunk_key: Sequence[str],
    data_types: Sequence[str],
    low: Key,
    high: Key,
    row_estimate: int,
    factor_bounds: tuple[float, float],
    exact_count_below: int,
) -> Decision:
    if len(chunk_key) > 1 or FAMILIES.get(data_types[0]) != "integer":
        # YEAR too: a stride bound from 1 to 99 reads as a two-digit year (50 is 2050), so one
        # from a 0000 key up missed rows; a YEAR has at most 256 values to walk
        return Decision("uneven", _key_kind(chunk_key, data_types))
    lo, hi = _as_int(low[0]), _as_int(high[0])
    rows, exact = row_estimate, False
    if (
        0 < rows < exact_count_below
        and distribution_factor(lo, hi, rows) > factor_bounds[1] * CLEARLY_SPARSE
    ):
        # sparse even if the estimate were several times too low: uneven, and no COUNT(*) scan to
        # prove it
        decision = choose_strategy(lo, hi, rows, exact, factor_bounds)
        return Decision(
            "uneven", decision.reason + " (estimated rows)", rows, exact, decision.factor
        )
    if rows < exact_count_below:
        rows, exact = int(query(mysql.count_sql(table, chunk_key, KeyRange.all()))[0][0]), True
    return choose_strategy(lo, hi, rows, exact, factor_bounds)


def plan_key_space(
    query: Query,
    table: str,
    chunk_key: Sequence[str],
    columns: Sequence[ColumnLike | str],
    chunk_size: int,
    **options: Any,
) -> TablePlan:
    """Plan a whole table: `open_splitter` run to the end, with the numbers in ``stats``.

    ``stats["queries"]`` counts every statement planning ran. For the uneven
    strategy ``stats["rows"]`` is exact (the walk counts rows); for the even one
    it is the count or estimate the strides were computed from. ``options`` are
    `open_splitter`'s keyword arguments (``row_estimate``, ``factor_bounds``, ...).
    """
    counting = CountingQuery(query)
    splitter, stats = open_splitter(counting, table, chunk_key, columns, chunk_size, **options)
    chunks = tuple(splitter.chunks()) if splitter is not None else ()
    if stats["strategy"] == "uneven":
        stats.update(rows=sum(c.estimated_rows or 0 for c in chunks), rows_exact=True)
    stats.update(chunks=len(chunks), queries=counting.count)
    return TablePlan(
        table=table,
        strategy=stats["strategy"],
        chunk_key=tuple(chunk_key),
        chunks=chunks,
        stats=stats,
    )
