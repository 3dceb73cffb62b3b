"""MySQL type families: the one table saying which family each column type belongs to.

Everything that branches on a column's ``information_schema`` DATA_TYPE - the
Arrow mapping, value conversion, the binlog decoders and shape check, the
chunk-key dialect, the demo's verifier - asks here, so a type is added or moved
in one place. Pure: it imports nothing from Tidemark (``chunking`` uses it too).

>>> family_of("mediumtext"), family_of("numeric"), family_of("geometry")
('text', 'decimal', 'spatial')
>>> sorted(ZERO_DATE_TYPES)
['date', 'datetime', 'timestamp']
"""

from __future__ import annotations

from typing import Literal

Family = Literal[
    "integer",
    "year",
    "decimal",
    "float",
    "bit",
    "text",
    "binary",
    "enum",
    "set",
    "json",
    "temporal",
    "spatial",
    "packed",
]

#: Integer types and their storage bits (signed -2**(bits-1) .. 2**(bits-1)-1, unsigned
#: 0 .. 2**bits-1).
INTEGER_BITS: dict[str, int] = {
    "tinyint": 8,
    "smallint": 16,
    "mediumint": 24,
    "int": 32,
    "integer": 32,
    "bigint": 64,
}

#: Each family and its DATA_TYPEs (lower case): the one table.
MEMBERS: dict[Family, tuple[str, ...]] = {
    "integer": tuple(INTEGER_BITS),
    "year": ("year",),
    "decimal": ("decimal", "numeric"),
    "float": ("float", "double", "real"),
    "bit": ("bit",),
    "text": ("char", "varchar", "tinytext", "text", "mediumtext", "longtext"),
    "binary": ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"),
    "enum": ("enum",),
    "set": ("set",),
    "json": ("json",),
    "temporal": ("date", "datetime", "timestamp", "time"),
    # MySQL 8 names GEOMETRYCOLLECTION's DATA_TYPE ``geomcollection``, MariaDB in full.
    "spatial": (
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    ),
    # MariaDB's types kept in 4 or 16 bytes and printed as text (orchestrator/schema/packed.py)
    "packed": ("inet4", "inet6", "uuid"),
}

#: DATA_TYPE -> its family.
FAMILIES: dict[str, Family] = {
    data_type: family for family, types in MEMBERS.items() for data_type in types
}

INTEGER_TYPES = frozenset(MEMBERS["integer"])
DECIMAL_TYPES = frozenset(MEMBERS["decimal"])
FLOAT_TYPES = frozenset(MEMBERS["float"])
TEXT_TYPES = frozenset(MEMBERS["text"])
BINARY_TYPES = frozenset(MEMBERS["binary"])
TEMPORAL_TYPES = frozenset(MEMBERS["temporal"])
SPATIAL_TYPES = frozenset(MEMBERS["spatial"])
PACKED_TYPES = frozenset(MEMBERS["packed"])
#: Temporal types with a zero value ('0000-00-00'), published as null even in a NOT NULL column.
ZERO_DATE_TYPES = TEMPORAL_TYPES - {"time"}


def family_of(data_type: str) -> Family | None:
    """The family of a DATA_TYPE (any case), or None for a type Tidemark does not map.

    >>> family_of("BIGINT"), family_of("year"), family_of("multipolygon")
    ('integer', 'year', 'spatial')
    """
    return FAMILIES.get(data_type.lower())
