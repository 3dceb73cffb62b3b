"""The even strategy's arithmetic: equal strides that cover [min, max] exactly once."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunking.even import EvenSplitter, even_boundaries

bounds = st.integers(min_value=-(2**63), max_value=2**64 - 1)


@settings(deadline=None)
@given(
    bounds,
    st.integers(min_value=0, max_value=10**15),
    st.integers(min_value=0, max_value=10**5),
    st.integers(min_value=1, max_value=10**5),
)
def test_strides_are_ascending_inside_the_range_and_balanced(
    low: int, width: int, rows: int, chunk_size: int
) -> None:
    high = low + width
    cuts = even_boundaries(low, high, rows, chunk_size)
    edges = [low, *cuts, high + 1]
    widths = [b - a for a, b in itertools.pairwise(edges)]
    assert all(w >= 1 for w in widths), "every chunk spans at least one key value"
    assert max(widths) - min(widths) <= 1
    assert len(widths) == max(1, min(width + 1, -(-max(rows, 1) // chunk_size)))


@settings(deadline=None)
@given(
    st.integers(min_value=-1000, max_value=1000),
    st.integers(min_value=0, max_value=3000),
    st.integers(min_value=1, max_value=500),
)
def test_dense_keys_give_chunks_of_at_most_chunk_size(
    low: int, extra: int, chunk_size: int
) -> None:
    high = low + extra
    rows = extra + 1
    chunks = list(EvenSplitter(low, high, rows, chunk_size).chunks())
    counted = []
    for c in chunks:
        first = low if c.range.start is None else int(c.range.start[0])  # type: ignore[arg-type]
        assert c.range.end is not None
        stop = int(c.range.end[0]) + (1 if c.range.end_inclusive else 0)  # type: ignore[arg-type]
        assert (
            c.range.contains((first,))
            and c.range.contains((stop - 1,))
            and not c.range.contains((stop,))
        )
        counted.append(stop - first)
    starts = [low if c.range.start is None else c.range.start[0] for c in chunks]
    ends = [c.range.end[0] for c in chunks if c.range.end is not None]
    assert starts[1:] == ends[:-1], "each chunk starts where the previous one ends"
    assert sum(counted) == rows
    assert all(n <= chunk_size for n in counted)
    assert len(chunks) == 1 or min(counted) >= chunk_size / 2
    assert [c.estimated_rows for c in chunks] == counted
    assert chunks[0].range.start is None
    assert chunks[-1].range.end == (high,) and chunks[-1].range.end_inclusive
    assert all(not c.range.end_inclusive for c in chunks[:-1])
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_keys_below_min_fall_in_the_first_chunk_and_above_max_in_none() -> None:
    chunks = list(EvenSplitter(100, 199, 100, 10).chunks())
    assert chunks[0].range.contains((-(2**63),))
    assert not any(c.range.contains((200,)) for c in chunks)


def test_unsigned_extremes() -> None:
    top = 2**64 - 1
    chunks = list(EvenSplitter(top - 9, top, 10, 3).chunks())
    assert len(chunks) == 4
    assert chunks[-1].range.end == (top,)


@pytest.mark.parametrize(("low", "high", "chunk_size"), [(5, 4, 1), (1, 2, 0)])
def test_invalid_arguments(low: int, high: int, chunk_size: int) -> None:
    with pytest.raises(ValueError):
        even_boundaries(low, high, 10, chunk_size)
