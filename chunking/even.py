"""The even strategy: a dense-enough integer key split into equal strides.

When a single integer key's values are spread evenly between its min and max
(the distribution factor ``(max - min + 1) / rows`` is within the configured
bounds), the chunk boundaries are arithmetic: no query per chunk at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from chunking.ranges import Chunk, KeyRange


def even_boundaries(low: int, high: int, rows: int, chunk_size: int) -> list[int]:
    """Split points dividing ``[low, high]`` into strides of about ``chunk_size`` rows.

    The stride count is ``ceil(rows / chunk_size)``, never more than there are
    key values; strides differ in width by at most one key value.

    Args:
        low: the smallest key.
        high: the largest key.
        rows: the (estimated) number of rows between them.
        chunk_size: target rows per chunk.

    Returns:
        The interior boundaries, ascending: chunk ``i`` is ``[b[i-1], b[i])``.

    >>> even_boundaries(1, 100, 100, 25)
    [26, 51, 76]
    >>> even_boundaries(1, 10, 3, 25)
    []
    >>> even_boundaries(0, 2, 1000, 10)
    [1, 2]
    >>> even_boundaries(2**64 - 4, 2**64 - 1, 4, 2)
    [18446744073709551614]
    """
    if high < low:
        raise ValueError(f"high {high} is below low {low}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, found {chunk_size}")
    span = high - low + 1
    count = max(1, min(span, -(-max(rows, 1) // chunk_size)))
    return [low + span * i // count for i in range(1, count)]


@dataclass(frozen=True, slots=True)
class EvenSplitter:
    """Chunks of an integer key by stride: ``(-inf, b1), [b1, b2), ..., [bn, high]``.

    >>> [c.range.describe() for c in EvenSplitter(1, 9, 9, 4).chunks()]
    ['(-inf, 4)', '[4, 7)', '[7, 9]']
    """

    low: int
    high: int
    rows: int
    chunk_size: int
    strategy: Literal["even"] = "even"

    def chunks(self) -> Iterator[Chunk]:
        bounds = even_boundaries(self.low, self.high, self.rows, self.chunk_size)
        span = self.high - self.low + 1
        starts: list[int | None] = [None, *bounds]
        widths_from = [self.low, *bounds]
        widths_to = [*bounds, self.high + 1]
        for index, start in enumerate(starts):
            width = widths_to[index] - widths_from[index]
            estimate = round(self.rows * width / span)
            if index == len(bounds):
                key_range = KeyRange.through(None if start is None else (start,), (self.high,))
            else:
                key_range = KeyRange.of(None if start is None else (start,), (bounds[index],))
            yield Chunk(index, key_range, estimate)
