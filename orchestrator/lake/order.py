"""The files' key order, in pyarrow and in Python: the order Spark sorts the stored values in.

Data files are sorted by key in Spark's order of the published values (`orchestrator.lake.layout`):
numbers, decimals and temporal values by value, binary bytewise, text by its UTF-8 bytes, NULL
first (a staged key part is NULL only for a zero date). pyarrow's sort orders every one of these
types the same way when nulls are placed first (`sort_keys`); Python orders the ``as_py`` values
the same way once NULL is made the smallest (`python_key`): Python compares ``str`` by code
point, which is the order of their UTF-8 bytes. Floats compare by value (MySQL stores no NaN,
and a key holds at most one of ``0.0`` and ``-0.0``, which both orders treat as equal).

Equality of keys is value equality with NULL equal to NULL, as Spark's ``<=>`` in the reconcile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: A key as Python values (``as_py``), in key-column order.
KeyTuple = tuple[Any, ...]


def sort_keys(columns: Sequence[str], *tiebreak: str) -> list[tuple[str, str, str]]:
    """pyarrow sort keys for the files' order, then ``tiebreak`` columns.

    >>> sort_keys(["a", "b"], "_src")  # doctest: +NORMALIZE_WHITESPACE
    [('a', 'ascending', 'at_start'), ('b', 'ascending', 'at_start'),
     ('_src', 'ascending', 'at_start')]
    """
    return [(c, "ascending", "at_start") for c in (*columns, *tiebreak)]


def python_key(values: KeyTuple) -> tuple[tuple[int, Any], ...]:
    """A key as a Python sort key in the files' order: NULL first, NaN last.

    >>> sorted([(2, "b"), (None, "z"), (2, "B"), (1, None)], key=python_key)
    [(None, 'z'), (1, None), (2, 'B'), (2, 'b')]
    >>> python_key(("é",)) > python_key(("z",))  # U+00E9 after U+007A, as in UTF-8 bytes
    True
    """
    out = []
    for value in values:
        if value is None:
            out.append((0, 0))
        elif isinstance(value, float) and math.isnan(value):
            out.append((2, 0))
        else:
            out.append((1, value))
    return tuple(out)


def key_at(columns: Sequence[pa.Array | pa.ChunkedArray], index: int) -> KeyTuple:
    """The key of row ``index`` (negative: from the end) as Python values.

    >>> key_at([pa.array([1, 2]), pa.array(["a", None])], -1)
    (2, None)
    """
    return tuple(c[index].as_py() for c in columns)


def bisect(
    columns: Sequence[pa.Array | pa.ChunkedArray],
    bound: KeyTuple,
    *,
    right: bool = False,
    lo: int = 0,
    hi: int | None = None,
) -> int:
    """Where ``bound`` goes among keys sorted in the files' order: the first index whose key is
    not below ``bound`` (``right``: not below or equal to it), within ``[lo, hi)``.

    A binary search: ``log2(n)`` keys are read, so it suits the boundaries of a few thousand
    files over millions of sorted changes.

    >>> keys = [pa.array([None, 1, 1, 3]), pa.array(["x", "a", "c", "a"])]
    >>> bisect(keys, (1, "b")), bisect(keys, (1, "c")), bisect(keys, (1, "c"), right=True)
    (2, 2, 3)
    >>> bisect(keys, (None, "a")), bisect(keys, (9, "")), bisect(keys, (1, "c"), lo=3)
    (0, 4, 3)
    """
    target = python_key(bound)
    hi = len(columns[0]) if hi is None else hi
    while lo < hi:
        mid = (lo + hi) // 2
        probe = python_key(key_at(columns, mid))
        if probe < target or (right and probe == target):
            lo = mid + 1
        else:
            hi = mid
    return lo


def same_as_next(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """Per row of keys sorted in the files' order, whether the next row has the same key (NULL
    equal to NULL); False for the last row.

    >>> same_as_next([pa.array([1, 1, 2, None, None]),
    ...               pa.array(["a", "a", "a", "b", "b"])]).to_pylist()
    [True, False, False, True, False]
    """
    n = len(columns[0]) if columns else 0
    if n == 0:
        return pa.array([], pa.bool_())
    same: Any = None
    for column in columns:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        a, b = array.slice(0, n - 1), array.slice(1)
        equal = pc.or_kleene(
            pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b))
        )
        same = equal if same is None else pc.and_(same, equal)
    return pa.concat_arrays([same, pa.array([False])])


def ascending_disjoint(ranges: Sequence[tuple[KeyTuple, KeyTuple]]) -> bool:
    """Whether ``(first, last)`` key ranges, in this order, are each ordered and each wholly
    below the next: the files' layout.

    >>> ascending_disjoint([((1,), (5,)), ((6,), (6,)), ((9,), (12,))])
    True
    >>> ascending_disjoint([(("a",), ("m",)), (("B",), ("z",))])  # 'B' sorts before 'm'
    False
    """
    previous = None
    for first, last in ranges:
        low, high = python_key(first), python_key(last)
        if high < low or (previous is not None and not previous < low):
            return False
        previous = high
    return True
