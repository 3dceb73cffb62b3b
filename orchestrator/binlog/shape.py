"""Whether a TABLE_MAP has the shape a table's rows were read with.

The binlog's rows events are decoded by the TABLE_MAP before them; the lake's
columns are those ``information_schema`` gave when the table was read. When the
two disagree (a DDL the capture did not see as a statement, a table re-created),
decoding would put values in the wrong columns or the wrong type: the table must
be read again instead. `shape_difference` says how they differ, or None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from orchestrator.binlog import events as ev
from orchestrator.binlog import metadata as md
from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog import versioned
from orchestrator.schema.charsets import CharsetError
from orchestrator.schema.families import (
    BINARY_TYPES,
    DECIMAL_TYPES,
    INTEGER_BITS,
    SPATIAL_TYPES,
    TEXT_TYPES,
)
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import definition_labels, text_decoder

#: Integer storage bits -> the binlog field type.
_INTEGER_FIELDS = {8: rd.TINY, 16: rd.SHORT, 24: rd.INT24, 32: rd.LONG, 64: rd.LONGLONG}
_BLOBS = frozenset({rd.BLOB, rd.TINY_BLOB, rd.MEDIUM_BLOB, rd.LONG_BLOB})

#: information_schema DATA_TYPE -> the binlog field types it can appear as: by family, except
#: where a family has several (FLOAT/DOUBLE, CHAR/VARCHAR/TEXT, each temporal type).
_FIELD_TYPES: dict[str, frozenset[int]] = {
    **{t: frozenset({_INTEGER_FIELDS[bits]}) for t, bits in INTEGER_BITS.items()},
    **dict.fromkeys(DECIMAL_TYPES, frozenset({rd.NEWDECIMAL})),
    # the TEXTs and BLOBs (MariaDB's COMPRESSED ones too); CHAR, VARCHAR below
    **dict.fromkeys(TEXT_TYPES | BINARY_TYPES, _BLOBS | {rd.BLOB_COMPRESSED}),
    **dict.fromkeys(SPATIAL_TYPES, frozenset({rd.GEOMETRY})),
    **{
        data_type: frozenset(kinds)
        for data_types, kinds in (
            ("char binary inet4 inet6 uuid", [rd.STRING]),
            ("varchar varbinary", [rd.VARCHAR, rd.VAR_STRING, rd.VARCHAR_COMPRESSED]),
            ("float", [rd.FLOAT]),
            ("double real", [rd.DOUBLE]),
            ("bit", [rd.BIT]),
            ("year", [rd.YEAR]),
            ("enum", [rd.ENUM]),
            ("set", [rd.SET]),
            ("json", [rd.JSON, rd.BLOB]),
            ("date", [rd.DATE, rd.NEWDATE]),
            ("datetime", [rd.DATETIME, rd.DATETIME2]),
            ("timestamp", [rd.TIMESTAMP, rd.TIMESTAMP2]),
            ("time", [rd.TIME, rd.TIME2]),
        )
        for data_type in data_types.split()
    },
}


def shape_difference(info: TableInfo, table_map: ev.TableMap) -> str | None:
    """How a TABLE_MAP differs from the planned `TableInfo` (None: it has the planned shape).

    A system-versioned table's rows events hold the history rows its changes make beside the
    current rows (the old version of each updated or deleted row, its period ended): they are
    applied as its current rows where ``info`` is their shape (`versioned.logged`, a TIMESTAMP
    period end), else the table is re-read (docs/limits.md)."""
    if info.versioned and not versioned.applied(info):
        return "a system-versioned table: its rows events hold history rows"
    if len(table_map.types) != len(info.columns):
        return (
            f"{len(table_map.types)} columns in the binlog but {len(info.columns)} when "
            "it was planned"
        )
    for kind, meta, ours in zip(table_map.types, table_map.meta, info.columns, strict=True):
        expected = _FIELD_TYPES.get(ours.data_type)
        if (expected is not None and rd.real_type(kind, meta) not in expected) or _sizes(
            kind, meta
        ) not in (None, _planned_sizes(ours)):
            return (
                f"column `{ours.name}` is {ours.column_type} as planned but has another "
                "type in the binlog"
            )
    return None


def _sizes(kind: int, meta: bytes) -> tuple[int, ...] | None:
    """What a TABLE_MAP says of a column's size: DECIMAL's precision and scale, BIT's bits,
    the fractional digits of TIME2/DATETIME2/TIMESTAMP2 (None for other types)."""
    if kind == rd.NEWDECIMAL:
        return meta[0], meta[1]
    if kind == rd.BIT:
        return (meta[1] * 8 + meta[0],)
    if kind in (rd.TIME2, rd.DATETIME2, rd.TIMESTAMP2):
        return (meta[0],)
    return None


def _planned_sizes(column: ColumnInfo) -> tuple[int, ...]:
    """The same sizes as ``information_schema`` gave them when the run was planned."""
    if column.data_type in DECIMAL_TYPES:
        return column.precision or 10, column.scale or 0
    if column.data_type == "bit":
        return (column.precision or column.display_width or 1,)
    return (column.datetime_precision or 0,)


# --------------------------------------------------------------------------- row metadata

_BINARY_COLLATION = 63


def metadata_difference(
    info: TableInfo, table_map: ev.TableMap, collations: Mapping[str, int], *, mariadb: bool
) -> str | None:
    """How a TABLE_MAP's optional metadata (``binlog_row_metadata=FULL``; part of it with
    MINIMAL) differs from the planned columns: names, signedness, charsets, ENUM/SET labels.

    Catches what the types alone cannot: two columns of one type renamed or swapped, labels
    appended or reordered, a charset conversion. ``collations`` maps collation names to the
    ids the binlog carries (``information_schema.COLLATIONS``); None: no difference seen.
    """
    unnamed = _unnamed_labels(info.columns)
    if not table_map.optional:
        return _labels_unknown(unnamed[0]) if unnamed else None
    types = [
        rd.real_type(kind, meta) for kind, meta in zip(table_map.types, table_map.meta, strict=True)
    ]
    try:
        found = md.parse(table_map.optional, types, mariadb=mariadb)
    except (ValueError, IndexError) as exc:  # never trusted blindly: the table is read again
        return f"optional metadata that does not parse: {exc}"
    columns = info.columns
    if found.names is not None and list(found.names) != [c.name for c in columns]:
        return (
            f"columns ({', '.join(found.names)}) in the binlog but "
            f"({', '.join(c.name for c in columns)}) when it was planned"
        )
    of = _columns_of(columns, types)
    for column, unsigned in zip(of(md.NUMERIC), found.unsigned or (), strict=False):
        if unsigned != (column.unsigned or column.data_type == "year"):
            return (
                f"column `{column.name}` is {'unsigned' if unsigned else 'signed'} in the "
                f"binlog but {column.column_type} as planned"
            )
    pairs = [
        *zip(of(md.character_types(mariadb)), found.collations or (), strict=False),
        *zip(of(frozenset({rd.ENUM, rd.SET})), found.enum_set_collations or (), strict=False),
    ]
    for column, collation in pairs:
        expected = collations.get(column.collation) if column.collation else _BINARY_COLLATION
        if expected is not None and collation != expected:
            return (
                f"column `{column.name}` has collation id {collation} in the binlog but "
                f"{column.collation or 'binary'} as planned"
            )
    labelled = [
        *zip(of(frozenset({rd.ENUM})), found.enum_labels or (), strict=False),
        *zip(of(frozenset({rd.SET})), found.set_labels or (), strict=False),
    ]
    named = {column.name for column, _ in labelled}
    for column in unnamed:
        if column.name not in named:
            return _labels_unknown(column)
    for column, labels in labelled:
        if not _same_labels(column, labels):
            return (
                f"column `{column.name}` has the labels of another {column.data_type.upper()} "
                f"in the binlog than {column.column_type} as planned"
            )
    return None


#: Character sets with characters of four bytes, which ``information_schema`` (utf8mb3) prints
#: as ``?`` in an ENUM or SET definition (MariaDB 10.11's SHOW CREATE TABLE too).
_FOUR_BYTE = frozenset({"utf8mb4", "utf16", "utf16le", "utf32"})


def _unnamed_labels(columns: Sequence[ColumnInfo]) -> list[ColumnInfo]:
    """The ENUM and SET columns whose planned labels may have lost characters to ``?``: a
    binlog value of theirs is an index, whose label only the binlog's own labels (FULL row
    metadata) can name."""
    return [
        c
        for c in columns
        if c.data_type in ("enum", "set")
        and (c.charset or "").lower() in _FOUR_BYTE
        and any("?" in label for label in definition_labels(c.column_type))
    ]


def _labels_unknown(column: ColumnInfo) -> str:
    return (
        f"column `{column.name}` has {column.data_type.upper()} labels that information_schema "
        "prints with '?' (characters of four bytes), which the binlog names only with "
        "binlog_row_metadata=FULL"
    )


def _columns_of(
    columns: Sequence[ColumnInfo], types: Sequence[int]
) -> Callable[[frozenset[int]], list[ColumnInfo]]:
    """The planned columns whose binlog type is one of some types, in column order."""

    def of(kinds: frozenset[int]) -> list[ColumnInfo]:
        return [column for column, kind in zip(columns, types, strict=True) if kind in kinds]

    return of


def _same_labels(column: ColumnInfo, labels: tuple[bytes, ...]) -> bool:
    """Whether the binlog's labels are the planned ones, decoded as the server reads them
    (their count, when the column's charset was not read from the server in this process)."""
    planned = list(definition_labels(column.column_type))
    if (column.charset or "").lower() == "binary":
        decode: Callable[[bytes], str] = lambda raw: raw.decode("latin-1")  # noqa: E731
    else:
        try:
            decode = text_decoder(column)
        except CharsetError:
            return len(planned) == len(labels)
    try:
        return planned == [decode(label) for label in labels]
    except UnicodeDecodeError:  # not what the planned labels were read as: re-read
        return False
