"""A TABLE_MAP's optional metadata (``binlog_row_metadata=FULL``): names, signedness,
charsets and ENUM/SET labels of the columns, as the server had them when it wrote the rows.

The block follows the column metadata and the NULL bitmap: a sequence of fields, each a
type byte, a length-encoded length and the value. Fields (MySQL 8.0 / MariaDB 10.5
``Table_map_log_event``): 1 signedness (a bit per numeric column, most significant bit
first, 1 unsigned); 2 default charset (the collation most character columns use, then
``(index among character columns, collation)`` pairs for the others) or 3 a collation
per character column; 4 column names (length-prefixed strings); 5 SET and 6 ENUM labels
(per column: a count, then length-prefixed labels); 10/11 the same two charset forms for
ENUM and SET columns. Other fields (geometry types, primary key, visibility) are skipped.
With ``binlog_row_metadata=MINIMAL`` the block holds only signedness and charsets, or
nothing: every field is optional here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.binlog import events as ev
from orchestrator.binlog import rowdecode as rd

#: Binlog types with a signedness bit (YEAR too: the server counts it, always unsigned).
NUMERIC = frozenset(
    {rd.TINY, rd.SHORT, rd.INT24, rd.LONG, rd.LONGLONG, rd.NEWDECIMAL, rd.FLOAT, rd.DOUBLE, rd.YEAR}
)
#: Binlog types with a charset in the character-column fields (binary ones: collation 63);
#: MariaDB counts GEOMETRY and its COMPRESSED columns among them too.
CHARACTER = frozenset(
    {rd.STRING, rd.VAR_STRING, rd.VARCHAR, rd.BLOB, rd.TINY_BLOB, rd.MEDIUM_BLOB, rd.LONG_BLOB}
)
MARIADB_CHARACTER = CHARACTER | {rd.GEOMETRY, rd.BLOB_COMPRESSED, rd.VARCHAR_COMPRESSED}


@dataclass(frozen=True, slots=True)
class RowMetadata:
    """What a TABLE_MAP's optional metadata says; None where it says nothing.

    Attributes:
        names: every column's name.
        unsigned: per numeric column (`NUMERIC`), in column order, whether it is unsigned.
        collations: per character column (`CHARACTER`), its collation id.
        enum_set_collations: per ENUM or SET column, its collation id.
        enum_labels: per ENUM column, its labels (bytes in the column's charset).
        set_labels: per SET column, its labels.
    """

    names: tuple[str, ...] | None = None
    unsigned: tuple[bool, ...] | None = None
    collations: tuple[int, ...] | None = None
    enum_set_collations: tuple[int, ...] | None = None
    enum_labels: tuple[tuple[bytes, ...], ...] | None = None
    set_labels: tuple[tuple[bytes, ...], ...] | None = None


def parse(block: bytes, types: Sequence[int], *, mariadb: bool = False) -> RowMetadata:
    """The optional metadata ``block`` of a table whose columns have the real binlog ``types``
    (ENUM and SET as themselves, not STRING), written by MariaDB or MySQL.

    >>> parse(bytes([1, 1, 0b0100_0000, 4, 4, 1, 97, 1, 98]), [rd.LONG, rd.LONG]).unsigned
    (False, True)
    """
    numeric = sum(kind in NUMERIC for kind in types)
    character = sum(kind in character_types(mariadb) for kind in types)
    enum_set = sum(kind in (rd.ENUM, rd.SET) for kind in types)
    found: dict[str, object] = {}
    pos = 0
    while pos < len(block):
        kind = block[pos]
        length, start = ev.lenenc(block, pos + 1)
        value, pos = block[start : start + length], start + length
        if pos > len(block):
            raise ValueError(f"optional metadata field {kind} runs past the event")
        match kind:
            case 1:
                found["unsigned"] = tuple(
                    bool(value[i // 8] & (0x80 >> i % 8)) for i in range(numeric)
                )
            case 2:
                found["collations"] = _default_charset(value, character)
            case 3:
                found["collations"] = tuple(_integers(value))
            case 4:
                found["names"] = tuple(s.decode("utf-8", "replace") for s in _strings(value))
            case 5 | 6:
                found["set_labels" if kind == 5 else "enum_labels"] = _labels(value)
            case 10:
                found["enum_set_collations"] = _default_charset(value, enum_set)
            case 11:
                found["enum_set_collations"] = tuple(_integers(value))
    return RowMetadata(**found)  # type: ignore[arg-type]


def character_types(mariadb: bool) -> frozenset[int]:
    """The binlog types the charset fields list, as the server that wrote them counts."""
    return MARIADB_CHARACTER if mariadb else CHARACTER


def _integers(value: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(value):
        number, pos = ev.lenenc(value, pos)
        out.append(number)
    return out


def _default_charset(value: bytes, count: int) -> tuple[int, ...]:
    """The default collation, with the ``(index, collation)`` exceptions applied."""
    default, *pairs = _integers(value)
    collations = [default] * count
    for index, collation in zip(pairs[::2], pairs[1::2], strict=True):
        if index >= count:
            raise ValueError(f"a charset for character column {index} of {count}")
        collations[index] = collation
    return tuple(collations)


def _strings(value: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(value):
        length, pos = ev.lenenc(value, pos)
        out.append(bytes(value[pos : pos + length]))
        pos += length
    return out


def _labels(value: bytes) -> tuple[tuple[bytes, ...], ...]:
    out, pos = [], 0
    while pos < len(value):
        count, pos = ev.lenenc(value, pos)
        labels = []
        for _ in range(count):
            length, pos = ev.lenenc(value, pos)
            labels.append(bytes(value[pos : pos + length]))
            pos += length
        out.append(tuple(labels))
    return tuple(out)
