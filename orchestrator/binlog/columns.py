"""Columns of raw binlog values -> Arrow arrays in staging types.

`rowdecode` leaves each value as the row image holds it (ints and floats as
``struct`` reads them, everything else as bytes); here a whole column is
converted at once, mostly by Arrow itself (integers, floats, small DECIMALs,
ENUM labels, UTF-8 text, CHAR's pad spaces; dates and times in `temporal`) and
otherwise by a small function per value, memoized where values repeat.

The result must equal, value for value, what `orchestrator.schema.values` makes of the
values python-mysql-replication decodes (with `orchestrator.binlog.reference`'s fixes),
which in turn equal the snapshot path's. Where the library has a quirk - a
DATETIME that is not a valid date becomes NULL, a fraction of seconds that is
not positive is ignored, a DATE that is not valid raises - it is mirrored here,
and the equality is tested on every type of the mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog.temporal import big_endian, temporal_finisher, u64
from orchestrator.schema import charsets, packed
from orchestrator.schema.families import (
    BINARY_TYPES,
    DECIMAL_TYPES,
    FLOAT_TYPES,
    PACKED_TYPES,
    SPATIAL_TYPES,
    TEMPORAL_TYPES,
    TEXT_TYPES,
)
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.types import is_boolean
from orchestrator.schema.values import (
    binary_length,
    definition_labels,
    spatial_wkb,
    staging_type,
    text_decoder,
)

Finisher = Callable[[Sequence[Any]], pa.Array]
JsonParser = Callable[[bytes], str]

_UTF8 = frozenset({"utf8mb4", "utf8mb3", "utf8"})


def _each(convert: Callable[[Any], Any], arrow: pa.DataType) -> Finisher:
    """Convert every non-NULL value with ``convert``."""
    return lambda values: pa.array([None if v is None else convert(v) for v in values], arrow)


def _memo(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` remembering its results (for values that repeat: dates, SET masks)."""
    cache: dict[Any, Any] = {}

    def remembered(value: Any) -> Any:
        try:
            return cache[value]
        except KeyError:
            if len(cache) > 100_000:
                cache.clear()
            result = cache[value] = convert(value)
            return result

    return remembered


# --------------------------------------------------------------------------- numbers


def _signed_int(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def _unsigned_int(raw: bytes) -> int:
    return int.from_bytes(raw, "little")


def _bits(nbits: int) -> Callable[[bytes], int]:
    """BIT(n) bytes as the library reads them (the top byte masked to its bits), wrapped
    to a signed 64-bit integer as Connector/J's ``getLong`` reads BIT(64)."""
    nbytes = (nbits + 7) // 8
    top = nbits % 8 if nbytes > 1 else nbits
    mask = ((1 << (top or 8)) - 1) << (8 * (nbytes - 1)) | ((1 << (8 * (nbytes - 1))) - 1)

    def convert(raw: bytes) -> int:
        number = int.from_bytes(raw, "big") & mask
        return number - (1 << 64) if number >= 1 << 63 else number

    return convert


def decimal_layout(precision: int, scale: int) -> list[tuple[int, int, int]]:
    """DECIMAL's digit groups, most significant first, as ``(bit shift, mask, 10**digits)``.

    >>> decimal_layout(12, 2)  # 1 digit in 1 byte, 9 in 4 bytes, 2 in 1 byte
    [(40, 255, 10), (8, 4294967295, 1000000000), (0, 255, 100)]
    """
    digits = rd.DIGIT_BYTES
    groups: list[tuple[int, int]] = []  # (bytes, decimal digits)
    whole, fraction = precision - scale, scale
    if whole % 9:
        groups.append((digits[whole % 9], whole % 9))
    groups += [(4, 9)] * (whole // 9) + [(4, 9)] * (fraction // 9)
    if fraction % 9:
        groups.append((digits[fraction % 9], fraction % 9))
    layout = []
    shift = 8 * sum(width for width, _ in groups)
    for width, count in groups:
        shift -= 8 * width
        layout.append((shift, (1 << (8 * width)) - 1, 10**count))
    return layout


def decimal_parts(precision: int, scale: int) -> Callable[[bytes], tuple[bool, int]]:
    """DECIMAL bytes -> ``(negative, unscaled digits as an int)``.

    The value is big-endian groups of 9 decimal digits in 4 bytes, the leading
    integer digits and trailing fraction digits in fewer; the top bit is the
    sign (set: positive), and a negative value has every bit inverted.

    >>> decimal_parts(12, 2)(bytes.fromhex("800000000d32"))  # 13.50
    (False, 1350)
    >>> decimal_parts(5, 2)(bytes.fromhex("7ffef3"))  # -1.12
    (True, 112)
    """
    size = rd.decimal_size(precision, scale)
    sign_bit = 1 << (8 * size - 1)
    everything = (1 << (8 * size)) - 1
    layout = decimal_layout(precision, scale)

    def parts(raw: bytes) -> tuple[bool, int]:
        stored = int.from_bytes(raw, "big")
        negative = not stored & sign_bit
        magnitude = (stored ^ everything if negative else stored) ^ sign_bit
        unscaled = 0
        for at, mask, base in layout:
            unscaled = unscaled * base + (magnitude >> at & mask)
        return negative, unscaled

    return parts


def _decimal(column: ColumnInfo, field: rd.Field) -> Finisher:
    parts = decimal_parts(field.meta[0], field.meta[1])
    precision, scale = column.precision or 10, column.scale or 0
    if precision > 38:  # exact text, as decimal_text prints the library's Decimal

        def text(raw: bytes) -> str:
            negative, unscaled = parts(raw)
            number = f"{unscaled:0{scale + 1}d}"
            body = f"{number[:-scale]}.{number[-scale:]}" if scale else number
            return f"-{body}" if negative else body

        return _each(text, pa.string())
    arrow = pa.decimal128(precision, scale)
    if field.meta[0] <= 18 and field.size <= 8:  # fits int64 arithmetic: Arrow does it
        return _small_decimal(field.meta[0], field.meta[1], field.size, arrow)

    def unscaled(raw: bytes) -> int:
        negative, number = parts(raw)
        return -number if negative else number

    storage = pa.decimal128(precision, 0)
    return lambda values: pa.array(
        [None if v is None else unscaled(v) for v in values], storage
    ).view(arrow)


def _small_decimal(precision: int, scale: int, size: int, arrow: pa.DataType) -> Finisher:
    """`decimal_parts` done by Arrow on whole columns, for DECIMALs of up to 18 digits."""
    sign_bit, everything = 1 << (8 * size - 1), (1 << (8 * size)) - 1
    layout = decimal_layout(precision, scale)

    def finish(values: Sequence[Any]) -> pa.Array:
        stored = big_endian(values, size)
        negative = pc.less(stored, u64(sign_bit))
        magnitude = pc.bit_wise_xor(
            pc.if_else(negative, pc.bit_wise_xor(stored, u64(everything)), stored), u64(sign_bit)
        )
        magnitude = magnitude.cast(pa.int64())
        unscaled: pa.Array | int = 0
        for at, mask, base in layout:
            group = pc.bit_wise_and(pc.shift_right(magnitude, at), mask)
            unscaled = pc.add(pc.multiply(unscaled, base), group)
        signed = pc.if_else(negative, pc.negate(unscaled), unscaled)
        return signed.cast(pa.decimal128(19, 0)).view(arrow)

    return finish


# --------------------------------------------------------------------------- text and labels


def _text(column: ColumnInfo, strip_pad: bool) -> Finisher:
    """Text columns: UTF-8 checked by Arrow; a set whose bytes below 0x80 are ASCII to the
    server (`charsets.ascii_compatible`) by Arrow where a value is ASCII, by the server's own
    answers otherwise (`orchestrator.schema.charsets`); the rest value by value."""
    charset = (column.charset or "utf8mb4").lower()
    decode = text_decoder(column)

    def finish(array: pa.Array) -> pa.Array:
        return pc.utf8_rtrim(array, characters=" ") if strip_pad else array

    def per_value(values: Sequence[Any]) -> pa.Array:
        return finish(pa.array([None if v is None else decode(v) for v in values], pa.string()))

    def utf8(values: Sequence[Any]) -> pa.Array:
        try:
            return finish(pa.array(values, pa.binary()).cast(pa.string()))
        except pa.ArrowInvalid:
            return per_value(values)  # raises the decoding error, naming the bytes

    def single_byte(values: Sequence[Any]) -> pa.Array:
        unchecked = pa.array(values, pa.binary()).view(pa.string())
        other = pc.invert(pc.fill_null(pc.string_is_ascii(unchecked), True))
        where = pc.indices_nonzero(other).to_pylist()
        if not where:
            return finish(unchecked)
        decoded = pa.array([decode(values[i]) for i in where], pa.string())
        return finish(pc.replace_with_mask(unchecked, other, decoded))

    if charset in _UTF8:
        return utf8
    return single_byte if charsets.ascii_compatible(charset) else per_value


def _enum(column: ColumnInfo) -> Finisher:
    labels = pa.array(["", *definition_labels(column.column_type)], pa.string())
    return lambda values: labels.take(pa.array(values, pa.int32()))


def _set(column: ColumnInfo) -> Finisher:
    labels = definition_labels(column.column_type)

    def text(mask: int | bytes) -> str:
        bits = mask if isinstance(mask, int) else int.from_bytes(mask, "little")
        return ",".join(label for i, label in enumerate(labels) if bits >> i & 1)

    return _each(_memo(text), pa.string())


def _json(column: ColumnInfo, field: rd.Field, parse: JsonParser) -> Finisher:
    if field.kind != rd.JSON:  # MariaDB's JSON is LONGTEXT: its text as it is
        return _text(column, strip_pad=False)
    return lambda values: pa.array(
        [None if not v else parse(bytes(v)) for v in values], pa.string()
    )


def _binary(column: ColumnInfo) -> Finisher:
    if column.data_type != "binary":
        return lambda values: pa.array(values, pa.binary())
    length = binary_length(column.column_type)  # the binlog drops BINARY's trailing 0x00
    return _each(lambda raw: raw.ljust(length, b"\0"), pa.binary())


# --------------------------------------------------------------------------- per column


def finisher(column: ColumnInfo, field: rd.Field, parse_json: JsonParser) -> Finisher:
    """The function taking a column of raw values (None for NULL) to its staging Arrow array.

    Args:
        column: the column as planned.
        field: its layout in the binlog (`rowdecode.field`).
        parse_json: prints MySQL's binary JSON as the server does (`orchestrator.binlog.jsonb`).
    """
    arrow = staging_type(column)
    t = column.data_type
    if is_boolean(column):
        if field.kind == rd.BIT:
            read = _bits(1 if not field.meta else field.meta[1] * 8 + field.meta[0])
            return _each(lambda raw: bool(read(raw)), arrow)
        return lambda values: pa.array(values, pa.int16()).cast(arrow)
    if field.kind == rd.INT24:
        return _each(_unsigned_int if column.unsigned else _signed_int, arrow)
    if t == "year":
        return _each(lambda year: year + 1900 if year else 0, arrow)
    if t in DECIMAL_TYPES:
        return _decimal(column, field)
    if t == "bit":
        return _each(_bits(field.meta[1] * 8 + field.meta[0]), arrow)
    if t in TEXT_TYPES:
        return _text(column, strip_pad=t == "char")
    if t == "enum":
        return _enum(column)
    if t == "set":
        return _set(column)
    if t == "json":
        return _json(column, field, parse_json)
    if t in BINARY_TYPES:
        return _binary(column)
    if t in PACKED_TYPES:
        return _each(packed.text_of(t), arrow)
    if t in SPATIAL_TYPES:  # the storage form (SRID, WKB), as a read of the column gives it
        return _each(spatial_wkb(column), arrow)
    if t in TEMPORAL_TYPES:
        return temporal_finisher(field, arrow)
    if pa.types.is_decimal(arrow):  # BIGINT UNSIGNED: Python ints to decimal cost 6.5 us each
        number = pa.uint64() if column.unsigned else pa.int64()
        return lambda values: pa.array(values, number).cast(arrow)
    if t in FLOAT_TYPES:
        return _float(arrow)
    return lambda values: pa.array(values, arrow)  # integers, as struct read them


def _float(arrow: pa.DataType) -> Finisher:
    """FLOAT and DOUBLE as struct read them, ``-0.0`` as ``0.0``: the server prints a stored
    negative zero as ``0``, which is what a snapshot reads (``-0.0 + 0.0`` is ``0.0``; every other
    value, NULL included, stays as it is).

    >>> [str(v) for v in _float(pa.float32())([-0.0, 0.0, -1.5, None]).to_pylist()]
    ['0.0', '0.0', '-1.5', 'None']
    """
    zero = pa.scalar(0.0, arrow)
    return lambda values: pc.add(pa.array(values, arrow), zero)
