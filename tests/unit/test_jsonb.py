"""MySQL's binary JSON (`orchestrator.binlog.jsonb`) printed as the server prints it, over
documents encoded by hand from the format (``json_binary.h``): no MySQL server runs here.
Expected texts are MySQL's ``JSON_EXTRACT``/SELECT output for the same documents."""

from __future__ import annotations

import contextlib
import random
import struct
from decimal import Decimal, localcontext

import pytest

from orchestrator.binlog import jsonb
from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog.jsonb import json_text

# --------------------------------------------------------------------------- an encoder


def varlen(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class Doc:
    """A value to encode: ``(type, bytes)``; containers compute their own layout."""

    def __init__(self, kind: int, body: bytes) -> None:
        self.kind, self.body = kind, body


def literal(value: bool | None) -> Doc:
    return Doc(jsonb.LITERAL, bytes([{None: 0, True: 1, False: 2}[value]]))


def integer(kind: int, value: int) -> Doc:
    return Doc(kind, struct.pack(jsonb._FIXED[kind], value))


def double(value: float) -> Doc:
    return Doc(jsonb.DOUBLE, struct.pack("<d", value))


def string(text: str) -> Doc:
    data = text.encode()
    return Doc(jsonb.STRING, varlen(len(data)) + data)


def opaque(field_type: int, data: bytes) -> Doc:
    return Doc(jsonb.OPAQUE, bytes([field_type]) + varlen(len(data)) + data)


def decimal(text: str, precision: int, scale: int) -> Doc:
    """MySQL's decimal binary (as in rows events), after its precision and scale."""
    value = Decimal(text)
    negative = value < 0
    with localcontext() as context:
        context.prec = 100
        digits = format(abs(value), f".{scale}f").replace(".", "")
    whole, fraction = (
        digits[: len(digits) - scale] if scale else digits,
        digits[len(digits) - scale :] if scale else "",
    )
    whole = whole.rjust(precision - scale, "0")
    groups: list[tuple[int, str]] = []
    lead = (precision - scale) % 9
    if lead:
        groups.append((rd.DIGIT_BYTES[lead], whole[:lead]))
    groups += [(4, whole[i : i + 9]) for i in range(lead, len(whole), 9)]
    groups += [(4, fraction[i : i + 9]) for i in range(0, scale - scale % 9, 9)]
    if scale % 9:
        groups.append((rd.DIGIT_BYTES[scale % 9], fraction[scale - scale % 9 :]))
    raw = bytearray(b"".join(int(g).to_bytes(w, "big") for w, g in groups))
    raw[0] ^= 0x80
    if negative:
        raw = bytearray(b ^ 0xFF for b in raw)
    return opaque(rd.NEWDECIMAL, bytes([precision, scale]) + bytes(raw))


def datetime_packed(
    y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, us: int = 0, neg: bool = False
) -> bytes:
    whole = ((y * 13 + mo) << 5 | d) << 17 | h << 12 | mi << 6 | s
    value = (whole << 24) + us
    return struct.pack("<q", -value if neg else value)


def time_packed(h: int, mi: int, s: int, us: int = 0, neg: bool = False) -> bytes:
    value = ((h << 12 | mi << 6 | s) << 24) + us
    return struct.pack("<q", -value if neg else value)


def container(items: list[Doc] | dict[str, Doc], large: bool = False) -> Doc:
    is_object = isinstance(items, dict)
    width = 4 if large else 2
    values = list(items.values()) if isinstance(items, dict) else items
    keys = [k.encode() for k in items] if isinstance(items, dict) else []
    count = len(values)
    header = 2 * width + (count * (width + 2) if is_object else 0) + count * (1 + width)
    key_data = b"".join(keys)
    out_keys, out_values, data = b"", b"", b""
    at = header + len(key_data)
    key_at = header
    for key in keys:
        out_keys += key_at.to_bytes(width, "little") + len(key).to_bytes(2, "little")
        key_at += len(key)
    for value in values:
        inline = value.kind in (jsonb.LITERAL, jsonb.INT16, jsonb.UINT16) or (
            large and value.kind in (jsonb.INT32, jsonb.UINT32)
        )
        if inline:
            out_values += bytes([value.kind]) + value.body.ljust(width, b"\0")
        else:
            out_values += bytes([value.kind]) + (at + len(data)).to_bytes(width, "little")
            data += value.body
    size = at + len(data)
    body = (
        count.to_bytes(width, "little")
        + size.to_bytes(width, "little")
        + out_keys
        + out_values
        + key_data
        + data
    )
    kind = (
        (jsonb.LARGE_OBJECT if large else jsonb.SMALL_OBJECT)
        if is_object
        else (jsonb.LARGE_ARRAY if large else jsonb.SMALL_ARRAY)
    )
    return Doc(kind, body)


def encode(doc: Doc) -> bytes:
    return bytes([doc.kind]) + doc.body


# --------------------------------------------------------------------------- cases

CASES: list[tuple[str, Doc, str]] = [
    ("null", literal(None), "null"),
    ("true", literal(True), "true"),
    ("int16", integer(jsonb.INT16, -32768), "-32768"),
    ("uint16", integer(jsonb.UINT16, 65535), "65535"),
    ("int32", integer(jsonb.INT32, -2147483648), "-2147483648"),
    ("uint32", integer(jsonb.UINT32, 4294967295), "4294967295"),
    ("int64", integer(jsonb.INT64, -9223372036854775808), "-9223372036854775808"),
    ("uint64", integer(jsonb.UINT64, 18446744073709551615), "18446744073709551615"),
    # doubles: shortest round-trip digits, ".0" on integral values, e-notation outside 1e-15..1e15
    ("double integral", double(3.0), "3.0"),
    ("double fraction", double(0.1), "0.1"),
    ("double sum", double(0.1 + 0.2), "0.30000000000000004"),
    ("double negative", double(-2.5), "-2.5"),
    ("double negative zero", double(-0.0), "-0.0"),
    ("double big fixed", double(123456789012345.0), "123456789012345.0"),
    ("double 1e15", double(1e15), "1e15"),
    ("double 16 digits", double(1234567890123456.7), "1234567890123456.8"),
    ("double huge", double(1.7976931348623157e308), "1.7976931348623157e308"),
    ("double small fixed", double(0.00001234), "0.00001234"),
    ("double tiny", double(1.5e-300), "1.5e-300"),
    ("double 1e-16", double(1e-16), "1e-16"),
    ("string", string('say "hi"\\ \n\t\x01 é 🌊 /'), '"say \\"hi\\"\\\\ \\n\\t\\u0001 é 🌊 /"'),
    ("empty string", string(""), '""'),
    ("long string", string("x" * 300), '"' + "x" * 300 + '"'),
    # opaque: DECIMAL keeps its scale; temporal values quoted with 6 fractional digits
    ("decimal", decimal("1.50", 10, 2), "1.50"),
    (
        "decimal negative",
        decimal("-12345678901234567890.123456789012", 40, 12),
        "-12345678901234567890.123456789012",
    ),
    ("decimal zero", decimal("0", 5, 0), "0"),
    ("decimal negative fraction", decimal("-0.05", 4, 2), "-0.05"),
    (
        "datetime",
        opaque(rd.DATETIME, datetime_packed(2015, 1, 15, 23, 24, 25)),
        '"2015-01-15 23:24:25.000000"',
    ),
    (
        "datetime micros",
        opaque(rd.DATETIME, datetime_packed(1000, 1, 1, 0, 0, 0, 1)),
        '"1000-01-01 00:00:00.000001"',
    ),
    (
        "timestamp",
        opaque(rd.TIMESTAMP, datetime_packed(2038, 1, 19, 3, 14, 7, 999999)),
        '"2038-01-19 03:14:07.999999"',
    ),
    ("date", opaque(rd.DATE, datetime_packed(2024, 2, 29)), '"2024-02-29"'),
    ("time", opaque(rd.TIME, time_packed(11, 30, 24)), '"11:30:24.000000"'),
    (
        "time negative",
        opaque(rd.TIME, time_packed(838, 59, 59, 500000, neg=True)),
        '"-838:59:59.500000"',
    ),
    ("opaque blob", opaque(rd.VAR_STRING, b"\xca\xfe"), '"base64:type253:yv4="'),
    (
        "small array",
        container(
            [
                integer(jsonb.INT16, 1),
                double(2.5),
                literal(None),
                literal(True),
                string("a"),
                integer(jsonb.INT32, 70000),
            ]
        ),
        '[1, 2.5, null, true, "a", 70000]',
    ),
    (
        "small object",
        container(
            {
                "a": integer(jsonb.INT16, 1),
                "bb": decimal("9.99", 3, 2),
                "c": opaque(rd.DATE, datetime_packed(2020, 12, 31)),
            }
        ),
        '{"a": 1, "bb": 9.99, "c": "2020-12-31"}',
    ),
    (
        "nested",
        container(
            {"k": container([container({}), container([]), container({'x"y': double(1e300)})])}
        ),
        '{"k": [{}, [], {"x\\"y": 1e300}]}',
    ),
    (
        "large object",
        container(
            {"a": integer(jsonb.INT32, -5), "b": integer(jsonb.UINT32, 7), "s": string("é")},
            large=True,
        ),
        '{"a": -5, "b": 7, "s": "é"}',
    ),
    ("large array", container([integer(jsonb.INT64, 1), literal(False)], large=True), "[1, false]"),
]


@pytest.mark.parametrize(("name", "doc", "expected"), CASES, ids=[c[0] for c in CASES])
def test_documents_print_as_mysql_prints_them(name: str, doc: Doc, expected: str) -> None:
    assert json_text(encode(doc)) == expected


def test_a_big_array_and_object() -> None:
    items = [integer(jsonb.INT16, i) for i in range(3000)]
    assert (
        json_text(encode(container(items, large=True)))
        == "[" + ", ".join(str(i) for i in range(3000)) + "]"
    )
    keys = {f"k{i:04d}": string(str(i)) for i in range(500)}
    assert (
        json_text(encode(container(keys)))
        == "{" + ", ".join(f'"k{i:04d}": "{i}"' for i in range(500)) + "}"
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x0e",
        b"\x04\x07",
        b"\x0c\xff\xff\xff\xff\xff\x01",
        bytes([jsonb.DOUBLE]) + struct.pack("<d", float("nan")),
    ],
)
def test_bad_documents_are_errors(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json_text(raw)


def test_truncated_and_corrupt_documents_are_errors_never_crashes() -> None:
    """Every prefix of every case is an error (ValueError) or, for a prefix that happens to
    be complete, text; random byte flips never raise anything but ValueError."""
    rng = random.Random(7)
    for _, doc, expected in CASES:
        raw = encode(doc)
        for cut in range(len(raw)):
            with contextlib.suppress(ValueError):
                json_text(raw[:cut])
        for _ in range(200):
            damaged = bytearray(raw)
            damaged[rng.randrange(len(raw))] = rng.randrange(256)
            with contextlib.suppress(ValueError):
                json_text(bytes(damaged))
        assert json_text(raw) == expected
