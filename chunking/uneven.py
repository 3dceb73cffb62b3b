"""The uneven strategy: boundaries read from the index, one short walk per chunk.

Each boundary is the key ``chunk_size`` places after the previous one,
``SELECT k FROM t WHERE k >= prev AND k <= max ORDER BY k LIMIT 1 OFFSET n``:
the database walks ``n + 1`` index entries from ``prev``, so planning the
whole table reads each index entry about once. Keys are compared only by the
database (text in the column's collation); Python only carries them along.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from chunking import mysql
from chunking.keys import Key
from chunking.mysql import Query
from chunking.ranges import Chunk, KeyRange


@dataclass(slots=True)
class UnevenSplitter:
    """Lazily yields chunks of exactly ``chunk_size`` rows, found by index walks.

    The last chunk runs to ``last`` inclusively; a remainder smaller than half
    a chunk joins the chunk before it, so no chunk exceeds 1.5 x ``chunk_size``
    and only a table smaller than half a chunk has a chunk below 0.5 x.

    Args:
        query: runs the planning queries.
        table: ``db.table``.
        chunk_key: key columns in index order.
        last: the largest key when planning; the plan stops there.
        chunk_size: rows per chunk.
    """

    query: Query
    table: str
    chunk_key: tuple[str, ...]
    last: Key
    chunk_size: int
    strategy: Literal["uneven"] = "uneven"

    def next_boundary(self, start: Key | None) -> Key | None:
        """The first key of the chunk after the one starting at ``start`` (None: no more)."""
        rows = self.query(
            mysql.boundary_sql(self.table, self.chunk_key, start, self.last, self.chunk_size)
        )
        return tuple(rows[0]) if rows else None

    def count(self, key_range: KeyRange) -> int:
        rows = self.query(mysql.count_sql(self.table, self.chunk_key, key_range))
        return int(rows[0][0])

    def chunks(self) -> Iterator[Chunk]:
        start: Key | None = None
        pending: KeyRange | None = None
        index = 0
        while (boundary := self.next_boundary(start)) is not None:
            if pending is not None:
                yield Chunk(index, pending, self.chunk_size)
                index += 1
            pending = KeyRange.of(start, boundary)
            start = boundary
        tail = self.count(KeyRange.through(start, self.last))
        if pending is not None and 2 * tail < self.chunk_size:
            yield Chunk(index, KeyRange.through(pending.start, self.last), self.chunk_size + tail)
            return
        if pending is not None:
            yield Chunk(index, pending, self.chunk_size)
            index += 1
        yield Chunk(index, KeyRange.through(start, self.last), tail)
