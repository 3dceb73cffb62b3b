"""A stable 64-bit hash of a whole row, and the row's identity: how a table without a key is laid
out (docs/output.md, "Tables without a key").

A table without a primary or unique NOT NULL key is published as the multiset of its rows. Its
data files are sorted by `row_hashes` of the published values and each holds one hash range, so a
changed row can be in one file only (`orchestrator.lake.layout`'s territories, on the hash), and
identical rows sit together in one file. The hash is never a column of the files: readers see the
source's columns only. It is recorded in manifests (`file_ranges` hold each file's first and last
hash), so it must never change: it is defined here on the published Arrow values, computed with
numpy, and pinned by the doctests below and tests/unit/test_rowhash.py.

*Which rows are identical.* Two rows are identical when every column holds the same value, NULL
being the same as NULL (`row_identity`). A float is taken by its value: ``-0.0`` is ``0.0`` (both
paths publish a stored ``-0.0`` as ``0.0``, docs/types.md, but files written before they did may
hold it) and every NaN is one. The hash agrees: identical rows hash alike, whichever path read them.

*The hash.* Per column, a 64-bit value of each cell: integers, dates, times and timestamps as
their 64-bit integers, booleans as 0/1, floats as the bits of their double (zero and NaN made
canonical), DECIMAL as its two 64-bit words, text and binary as a polynomial over their bytes
(`_bytes_values`), NULL as a constant of its own. The cells are folded column by column through
MurmurHash3's 64-bit finaliser (`_mix`). Hashes of different rows can collide: the layout then
only puts them in the same file, and identity is always decided by `row_identity`.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_U64 = np.uint64
_NULL = _U64(0x9E3779B97F4A7C15)  # a NULL cell
_SEED = _U64(0x243F6A8885A308D3)
_CELL = _U64(0x632BE59BD9B4E019)  # added to a cell before mixing (the finaliser keeps 0 at 0)
_COLUMN = _U64(0x100000001B3)  # folds the row's cells in column order
_BYTE = 0x5851F42D4C957F2D  # the polynomial's odd multiplier (invertible modulo 2**64)
_BYTE_INVERSE = pow(_BYTE, -1, 1 << 64)
_LENGTH = _U64(0xD6E8FEB86659FD93)
#: Text bytes hashed at a time (the powers of the polynomial's multiplier are kept for this many).
_SLICE_BYTES = 1024 * 1024
_CANONICAL_NAN = struct.unpack("<Q", struct.pack("<d", math.nan))[0]


def _mix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, element-wise (uint64 arithmetic wraps)."""
    x = x ^ (x >> _U64(33))
    x = x * _U64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> _U64(33))
    x = x * _U64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> _U64(33))


def row_hashes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The hash of each row of ``table`` (published values), as a uint64 numpy array.

    >>> t = pa.table({"a": pa.array([1, 1, None], pa.int32()), "b": ["x", "x", "x"]})
    >>> h = row_hashes(t)
    >>> bool(h[0] == h[1]), bool(h[0] == h[2])
    (True, False)
    >>> [int(v) for v in row_hashes(pa.table({"a": pa.array([0, 7], pa.int64()),
    ...                                       "s": ["", "tidemark"]}))]
    [17686004997332163053, 5497437921795709952]
    """
    h = np.full(table.num_rows, _SEED + _U64(table.num_columns), dtype=np.uint64)
    for column in table.columns:
        h = _mix(h * _COLUMN + cell_values(column))
    return h


def cell_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each cell's 64-bit value (before mixing), NULL a constant of its own.

    >>> [hex(int(v)) for v in cell_values(pa.array([-0.0, 0.0, None]))]
    ['0x155105a0563a073c', '0x155105a0563a073c', '0x9e3779b97f4a7c15']
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(array) == 0:
        return np.zeros(0, dtype=np.uint64)
    values = _mix(_values(array) + _CELL)
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        values = np.where(valid, values, _NULL)
    return values


def _values(array: pa.Array) -> np.ndarray:
    """The cells of a non-empty array as uint64, NULL cells unspecified."""
    kind = array.type
    if pa.types.is_null(kind):
        return np.zeros(len(array), dtype=np.uint64)
    if pa.types.is_boolean(kind):
        return pc.fill_null(array, False).to_numpy(zero_copy_only=False).astype(np.uint64)
    if pa.types.is_floating(kind):
        return _float_values(array)
    if pa.types.is_decimal(kind):
        return _decimal_values(array)
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        return _bytes_values(array, np.int32)
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return _bytes_values(array, np.int64)
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind):  # dates, times, timestamps
        return _integer_values(array)
    raise TypeError(f"no row hash for Arrow type {kind}")


def _integer_values(array: pa.Array) -> np.ndarray:
    """Integers and temporal values (their stored integers) as 64-bit words."""
    kind = array.type
    width = kind.bit_width
    if not pa.types.is_integer(kind):  # a date, time or timestamp: its integer as stored
        array = array.view(pa.int32() if width == 32 else pa.int64())
    elif pa.types.is_unsigned_integer(kind) and width == 64:
        array = array.view(pa.int64())
    if array.type != pa.int64():
        array = array.cast(pa.int64())
    return pc.fill_null(array, 0).to_numpy(zero_copy_only=False).view(np.uint64)


def _float_values(array: pa.Array) -> np.ndarray:
    """A float's double bits, ``-0.0`` as ``0.0`` and every NaN as one."""
    doubles = pc.fill_null(array.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    doubles = np.where(doubles == 0.0, 0.0, doubles)  # -0.0 == 0.0
    bits = doubles.view(np.uint64).copy()
    bits[np.isnan(doubles)] = _U64(_CANONICAL_NAN)
    return bits


def _decimal_values(array: pa.Array) -> np.ndarray:
    """A DECIMAL's 128-bit integer (its unscaled value, little-endian) folded into 64 bits."""
    width = array.type.byte_width
    data = array.buffers()[1]
    assert data is not None, "a non-empty decimal array has a values buffer"
    words = np.frombuffer(data, dtype=np.uint64)
    per = width // 8
    cells = words[array.offset * per : (array.offset + len(array)) * per].reshape(-1, per)
    out = cells[:, 0].copy()
    for i in range(1, per):
        out = _mix(out) + cells[:, i]
    return out


def _bytes_values(array: pa.Array, offset_type: type[np.integer[Any]]) -> np.ndarray:
    """Text or binary cells: ``sum((b_k + 1) * M**k)`` over a cell's bytes ``b_0 b_1 ...``
    modulo 2**64, ``M`` odd, its length folded in.

    The sums come from one prefix sum over the bytes weighted by ``M**j`` (``j`` their place in
    the buffer), each cell's difference brought back to its first byte by ``M**-start``; the
    cells are taken a few megabytes of bytes at a time.
    """
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    out = np.empty(len(array), dtype=np.uint64)
    first = 0
    while first < len(array):
        last = int(np.searchsorted(offsets, offsets[first] + _SLICE_BYTES, side="right")) - 1
        if last <= first:  # one cell longer than a slice: in pieces
            out[first] = _long_cell(data, int(offsets[first]), int(offsets[first + 1]))
            first += 1
            continue
        last = min(last, len(array))
        out[first:last] = _polynomial(offsets[first : last + 1], data)
        first = last
    return out


def _polynomial(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """`_bytes_values` of the cells between ``offsets`` (one more than the cells)."""
    base = int(offsets[0])
    size = int(offsets[-1]) - base
    starts, ends = offsets[:-1] - base, offsets[1:] - base
    powers, inverse = _powers()
    weighted = (data[base : base + size].astype(np.uint64) + _U64(1)) * powers[:size]
    prefix = np.empty(size + 1, dtype=np.uint64)
    prefix[0] = 0
    np.cumsum(weighted, dtype=np.uint64, out=prefix[1:])
    sums = (prefix[ends] - prefix[starts]) * inverse[starts]
    lengths = (ends - starts).astype(np.uint64)
    return sums ^ (lengths * _LENGTH)


@functools.cache
def _powers() -> tuple[np.ndarray, np.ndarray]:
    """``M**j`` and ``M**-j`` modulo 2**64 for ``j`` up to `_SLICE_BYTES` (computed once)."""
    out = []
    for factor in (_BYTE, _BYTE_INVERSE):
        steps = np.full(_SLICE_BYTES + 1, factor, dtype=np.uint64)
        steps[0] = 1
        out.append(np.cumprod(steps, dtype=np.uint64))
    return out[0], out[1]


def _long_cell(data: np.ndarray, start: int, end: int) -> np.uint64:
    """`_polynomial` of one cell, a slice of its bytes at a time."""
    total = 0
    for piece in range(start, end, _SLICE_BYTES):
        stop = min(piece + _SLICE_BYTES, end)
        part = int(_polynomial(np.array([piece, stop], dtype=np.int64), data)[0])
        part ^= (stop - piece) * int(_LENGTH) % (1 << 64)  # its length, folded in, taken out
        total = (total + part * pow(_BYTE, piece - start, 1 << 64)) % (1 << 64)
    return _U64(total ^ ((end - start) * int(_LENGTH) % (1 << 64)))


def row_identity(values: Sequence[Any]) -> tuple[Any, ...]:
    """A row's values as a tuple that compares equal exactly for identical rows (module
    docstring): floats by value, ``-0.0`` as ``0.0``, every NaN as one.

    >>> row_identity([1, -0.0, None]) == row_identity([1, 0.0, None])
    True
    >>> row_identity([math.nan]) == row_identity([float("nan")])
    True
    """
    return tuple(_identity(v) for v in values)


def _identity(value: Any) -> Any:
    if isinstance(value, float):
        if value == 0.0:
            return ("float", 0.0)
        if math.isnan(value):
            return ("float", "nan")
        return ("float", value)
    return value
