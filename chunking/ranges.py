"""Value objects: a key range, a chunk, a table's plan.

A `KeyRange` is half-open, ``[start, end)``, and ``None`` means unbounded on
that side. A plan's last chunk ends *at* the largest key seen when planning,
inclusively (``end_inclusive=True``): keys above it arrive after the start
position and come from the binlog, and text keys have no "next value" to use
as an exclusive bound, so an inclusive end is the one form every key type has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from chunking.keys import Key, decode_key, encode_key, key_order, short

Strategy: TypeAlias = Literal["even", "uneven", "empty"]


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Keys ``k`` with ``start <= k < end`` (``k <= end`` when ``end_inclusive``).

    >>> KeyRange.all()
    KeyRange(start=None, end=None, end_inclusive=False)
    >>> KeyRange.of((1,), (10,)).contains((9,)), KeyRange.of((1,), (10,)).contains((10,))
    (True, False)
    >>> KeyRange.through((1,), (10,)).contains((10,))
    True
    >>> KeyRange.of(None, (5,)).contains((-2**63,))
    True
    """

    start: Key | None = None
    end: Key | None = None
    end_inclusive: bool = False

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                raise TypeError(
                    f"KeyRange.{name} must be a tuple or None, found {type(value).__name__}"
                )
            if value is not None and not value:
                raise ValueError(f"KeyRange.{name} is an empty key")
        if self.end_inclusive and self.end is None:
            raise ValueError("an inclusive end needs an end key")
        if self.start is not None and self.end is not None and len(self.start) != len(self.end):
            raise ValueError(f"start and end have different arity: {self.start!r}, {self.end!r}")

    @classmethod
    def all(cls) -> KeyRange:
        """Every key."""
        return cls(None, None)

    @classmethod
    def of(cls, start: Key | None, end: Key | None) -> KeyRange:
        """``[start, end)``; ``None`` for an unbounded side."""
        return cls(start, end)

    @classmethod
    def through(cls, start: Key | None, last: Key) -> KeyRange:
        """``[start, last]``: the form of a plan's last chunk."""
        return cls(start, last, end_inclusive=True)

    @property
    def is_all(self) -> bool:
        return self.start is None and self.end is None

    def contains(self, key: Key) -> bool:
        """Whether ``key`` is in the range, for keys Python can order (see `key_order`)."""
        if self.start is not None and key_order(key, self.start) < 0:
            return False
        if self.end is None:
            return True
        order = key_order(key, self.end)
        return order < 0 or (order == 0 and self.end_inclusive)

    def describe(self) -> str:
        """``[1, 10)``, ``(-inf, 10)``, ``[1, 10]`` — for humans.

        >>> KeyRange.through(None, (5, 'x')).describe()
        "(-inf, (5, 'x')]"
        """
        left = "(-inf" if self.start is None else f"[{short(self.start)}"
        right = (
            "+inf)"
            if self.end is None
            else f"{short(self.end)}{']' if self.end_inclusive else ')'}"
        )
        return f"{left}, {right}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (keys through `encode_key`)."""
        return {
            "start": encode_key(self.start),
            "end": encode_key(self.end),
            "end_inclusive": self.end_inclusive,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyRange:
        return cls(
            decode_key(data.get("start")),
            decode_key(data.get("end")),
            bool(data.get("end_inclusive", False)),
        )


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a table: its position in the plan, its key range, its expected size."""

    index: int
    range: KeyRange
    estimated_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, **self.range.to_dict(), "estimated_rows": self.estimated_rows}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chunk:
        return cls(int(data["index"]), KeyRange.from_dict(data), data.get("estimated_rows"))


@dataclass(frozen=True)
class TablePlan:
    """A table's chunks, in key order, covering ``(-inf, max key at planning]`` exactly once.

    Attributes:
        table: ``db.table``.
        strategy: ``even``, ``uneven``, or ``empty`` (no rows when planned: no chunks).
        chunk_key: the key columns, in index order.
        chunks: the chunks; the first starts unbounded, the last ends inclusively at the max key.
        stats: the numbers behind the decision: ``min``, ``max`` (encoded keys), ``rows``,
            ``rows_exact``, ``factor``, ``chunk_size``, ``queries``, ``reason``.
    """

    table: str
    strategy: str
    chunk_key: tuple[str, ...]
    chunks: tuple[Chunk, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def estimated_rows(self) -> int:
        return sum(c.estimated_rows or 0 for c in self.chunks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "strategy": self.strategy,
            "chunk_key": list(self.chunk_key),
            "chunks": [c.to_dict() for c in self.chunks],
            "stats": dict(self.stats),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TablePlan:
        return cls(
            table=data["table"],
            strategy=data["strategy"],
            chunk_key=tuple(data["chunk_key"]),
            chunks=tuple(Chunk.from_dict(c) for c in data["chunks"]),
            stats=dict(data.get("stats", {})),
        )
