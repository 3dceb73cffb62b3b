"""The MySQL / MariaDB dialect: identifiers, literals, key comparisons, planning queries.

Everything that turns a value into SQL text goes through `sql_literal`, the one
escaping function. Predicates are plain SQL text (no ``%s`` placeholders), so
they work as Spark JDBC ``predicates`` and as PyMySQL queries run without
parameters.

Composite keys compare lexicographically. The predicate spells the row
comparison ``(a, b) >= (x, y)`` out as ``(a > x OR (a = x AND b >= y))``:
the same rows, but MariaDB's range optimizer turns only the spelled-out form
into an index range (it scans the whole index for a row constructor).

Literals and predicates are written for the session ``sql_mode`` `SESSION_SQL_MODE`, which
every Tidemark session on the source sets: whatever the server's global mode, backslashes
escape (``NO_BACKSLASH_ESCAPES`` off), ``''`` is not NULL (``EMPTY_STRING_IS_NULL`` off), ``"``
quotes strings and ``||`` is OR (``ANSI_QUOTES``, ``PIPES_AS_CONCAT`` off), and a date the
server kept under ``ALLOW_INVALID_DATES`` reads back as itself, in a ``UNION`` too. Planning
checks `backslash_escapes_off` on its session and refuses one where that did not hold.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal, Protocol

from chunking.keys import Key, KeyValue, format_timedelta
from chunking.ranges import KeyRange
from orchestrator.schema.families import FAMILIES, Family

#: The type families a chunk key may have (ENUM, SET, BIT and JSON are refused below).
KEY_FAMILIES: frozenset[Family] = frozenset(
    {"integer", "year", "decimal", "float", "text", "binary", "temporal", "packed"}
)
#: The families whose key values are Python ints (YEAR too): ranges of them can be computed.
INTEGER_FAMILIES: frozenset[Family] = frozenset({"integer", "year"})

_UNSUPPORTED = {
    "enum": "ENUM sorts by member number but compares as text, so ranges would not partition it",
    "set": "SET sorts by bit value but compares as text, so ranges would not partition it",
    "bit": "BIT values have no literal that compares reliably",
    "json": "JSON has no total order",
    # the server prints a FLOAT with 6 significant digits (16777217 as 16777200), so a bound
    # read back is not the stored value: ranges missed rows, and an index walk could loop
    "float": "FLOAT values print rounded to 6 digits, so no literal reaches a stored value exactly",
}

#: The ``sql_mode`` of every session Tidemark opens on the source (PyMySQL and JDBC). Only
#: reads run there, and of the modes only these change what a read returns. Without
#: ALLOW_INVALID_DATES a UNION turned a DATETIME key's '2020-04-31 10:00:00' into a zero date,
#: and planning a table whose largest key was such a date published it empty.
SESSION_SQL_MODE = "ALLOW_INVALID_DATES"

#: Session variables that bound what a SELECT returns or may examine, lifted in every session of
#: Tidemark (its pymysql sessions and the Spark reads'): a global ``sql_select_limit`` cut every
#: chunk read short, silently (2,000 of 400,000 rows published, exit 0), and ``sql_big_selects``
#: off with a low ``max_join_size`` refused them.
UNBOUNDED_SELECTS = {"sql_select_limit": "18446744073709551615", "sql_big_selects": "1"}

SQL_MODE_QUERY = "SELECT @@SESSION.sql_mode"

Operator = Literal[">=", ">", "<", "<="]


class Query(Protocol):
    """Runs one SQL statement, given as complete text (no parameters), and returns its rows."""

    def __call__(self, sql: str, /) -> Sequence[Sequence[Any]]: ...


class ColumnLike(Protocol):
    """What the dialect needs to know of a column (``orchestrator.schema.tables.ColumnInfo``
    fits)."""

    @property
    def name(self) -> str: ...

    @property
    def data_type(self) -> str: ...


def unsupported_key_reason(data_type: str, collation: str | None = None) -> str | None:
    """Why a column of this type (and collation) cannot be a chunk key, or None if it can.

    CHAR with a NO PAD collation is refused: MariaDB orders its index by the
    space-padded value but evaluates comparisons on the unpadded one, so a key
    holding a character that sorts below a space (a tab, ``\x1a``) falls in no
    range, or in two, depending on whether the read uses the index.

    >>> (unsupported_key_reason("bigint") is None,
    ...  unsupported_key_reason("varchar", "utf8mb4_nopad_bin"))
    (True, None)
    >>> unsupported_key_reason("enum")
    'ENUM sorts by member number but compares as text, so ranges would not partition it'
    >>> unsupported_key_reason("geometry")
    'geometry is not a supported chunk-key type'
    >>> unsupported_key_reason("char", "utf8mb4_nopad_bin")[:45]
    'CHAR with the NO PAD collation utf8mb4_nopad_'
    """
    data_type = data_type.lower()
    if data_type in _UNSUPPORTED:
        return _UNSUPPORTED[data_type]
    if data_type == "char" and collation and "nopad" in collation.lower():
        return (
            f"CHAR with the NO PAD collation {collation} is ordered by the index and compared by "
            "expressions differently (padded vs unpadded), so ranges would not partition it; "
            "use VARCHAR or a PAD SPACE collation for the column, or another unique key"
        )
    return (
        None
        if FAMILIES.get(data_type) in KEY_FAMILIES
        else f"{data_type} is not a supported chunk-key type"
    )


def quote_identifier(name: str) -> str:
    """A backquoted identifier.

    >>> quote_identifier("order id"), quote_identifier("we`ird")
    ('`order id`', '`we``ird`')
    """
    return "`" + name.replace("`", "``") + "`"


def quote_table(name: str) -> str:
    """``db.table`` as ```db`.`table```.

    >>> quote_table("shop.orders")
    '`shop`.`orders`'
    """
    database, _, table = name.partition(".")
    if not table:
        raise ValueError(f"expected `database.table`, found {name!r}")
    return f"{quote_identifier(database)}.{quote_identifier(table)}"


_ESCAPES = str.maketrans(
    {"\\": "\\\\", "'": "\\'", '"': '\\"', "\0": "\\0", "\n": "\\n", "\r": "\\r", "\x1a": "\\Z"}
)


def sql_literal(value: KeyValue | bool) -> str:
    r"""A MySQL literal for ``value``: the one place a value becomes SQL text.

    >>> print(sql_literal("it's a \\ \"test\"\n%"))
    'it\'s a \\ \"test\"\n%'
    >>> sql_literal("nul\0 and ^Z\x1a")
    "'nul\\0 and ^Z\\Z'"
    >>> sql_literal(18446744073709551615), sql_literal(-42), sql_literal(True)
    ('18446744073709551615', '-42', '1')
    >>> sql_literal(Decimal("1E+3")), sql_literal(Decimal("-0.000001")), sql_literal(0.1)
    ('1000', '-0.000001', '0.1')
    >>> sql_literal(b"\x00'\xff"), sql_literal(b"")
    ("X'0027ff'", "X''")
    >>> sql_literal(datetime(999, 1, 2, 3, 4, 5, 6))
    "TIMESTAMP'0999-01-02 03:04:05.000006'"
    >>> sql_literal(date(2024, 2, 29)), sql_literal(time(23, 59, 59, 999999))
    ("DATE'2024-02-29'", "TIME'23:59:59.999999'")
    >>> sql_literal(-timedelta(hours=838, minutes=59, seconds=59))
    "TIME'-838:59:59.000000'"
    >>> sql_literal(None)
    'NULL'
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return "'" + value.translate(_ESCAPES) + "'"
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"MySQL has no literal for Decimal {value}")
        return format(value, "f")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"MySQL has no literal for float {value}")
        return repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return "X'" + bytes(value).hex() + "'"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise ValueError(
                "convert an aware datetime to the session time zone before rendering it"
            )
        return "TIMESTAMP'" + value.isoformat(sep=" ", timespec="microseconds") + "'"
    if isinstance(value, date):
        return "DATE'" + value.isoformat() + "'"
    if isinstance(value, time):
        if value.tzinfo is not None:
            raise ValueError("MySQL TIME has no time zone")
        return "TIME'" + value.isoformat(timespec="microseconds") + "'"
    if isinstance(value, timedelta):
        return "TIME'" + format_timedelta(value) + "'"
    raise TypeError(f"no MySQL literal for a value of type {type(value).__name__}")


def _fits(data_type: str, value: KeyValue) -> bool:
    family = FAMILIES.get(data_type)
    if isinstance(value, str) and family == "temporal":
        return True  # zero dates ('0000-00-00') come back from PyMySQL as text
    if family in INTEGER_FAMILIES:
        return isinstance(value, int) and not isinstance(value, bool)
    if family in ("text", "packed"):  # packed: INET6, UUID as their text
        return isinstance(value, str)
    if family == "binary":
        return isinstance(value, bytes | bytearray | memoryview)
    if family in ("decimal", "float"):
        return isinstance(value, int | Decimal | float) and not isinstance(value, bool)
    checks = {
        "date": lambda v: isinstance(v, date) and not isinstance(v, datetime),
        "datetime": lambda v: isinstance(v, datetime),
        "timestamp": lambda v: isinstance(v, datetime),
        "time": lambda v: isinstance(v, timedelta | time),
    }
    return checks.get(data_type, lambda v: True)(value)


def check_key(columns: Sequence[ColumnLike | str], key: Key) -> None:
    """Refuse a key whose values do not suit its columns' types.

    A mismatch would change how MySQL compares (a text column against a number
    compares as numbers), so a wrongly decoded key is an error, not a surprise.

    >>> check_key(["bigint", "varchar"], (1, "a"))
    >>> check_key(["varchar"], (1,))
    Traceback (most recent call last):
    ...
    TypeError: chunk-key column 1 is varchar but the key holds int 1
    """
    if len(columns) != len(key):
        raise ValueError(f"key {key!r} has {len(key)} values for {len(columns)} columns")
    for i, (column, value) in enumerate(zip(columns, key, strict=True)):
        data_type = (column if isinstance(column, str) else column.data_type).lower()
        if not _fits(data_type, value):
            label = column if isinstance(column, str) else f"`{column.name}` ({data_type})"
            where = f"column {i + 1} is {label}" if isinstance(column, str) else f"column {label}"
            raise TypeError(f"chunk-key {where} but the key holds {type(value).__name__} {value!r}")


def key_columns_of(
    chunk_key: Sequence[str], columns: Sequence[ColumnLike | str]
) -> list[ColumnLike | str]:
    """The descriptions of the key's columns, from the key's or the whole table's.

    Bare data types are positional (one per key column); described columns are
    matched by name, case-insensitively.

    >>> key_columns_of(["b"], ["int"])
    ['int']
    >>> key_columns_of(["id"], ["int", "text"])
    Traceback (most recent call last):
    ...
    ValueError: 2 data types for chunk key ['id']
    """
    if all(isinstance(c, str) for c in columns):
        if len(columns) != len(chunk_key):
            raise ValueError(f"{len(columns)} data types for chunk key {list(chunk_key)}")
        return list(columns)
    by_name = {c.name.lower(): c for c in columns if not isinstance(c, str)}
    missing = [name for name in chunk_key if name.lower() not in by_name]
    if missing:
        raise ValueError(f"chunk-key column(s) {', '.join(missing)} not among the columns given")
    return [by_name[name.lower()] for name in chunk_key]


def compare(chunk_key: Sequence[str], op: Operator, key: Key) -> str:
    """``chunk_key op key`` in lexicographic order, spelled out so indexes serve it.

    >>> compare(["id"], ">=", (5,))
    '`id` >= 5'
    >>> compare(["a", "b"], "<", (1, "x"))
    "(`a` < 1 OR (`a` = 1 AND `b` < 'x'))"
    >>> compare(["a", "b", "c"], "<=", (1, 2, 3))
    '(`a` < 1 OR (`a` = 1 AND (`b` < 2 OR (`b` = 2 AND `c` <= 3))))'
    """
    if len(chunk_key) != len(key) or not key:
        raise ValueError(f"key {key!r} does not match chunk key {list(chunk_key)}")
    column, literal = quote_identifier(chunk_key[0]), sql_literal(key[0])
    if len(chunk_key) == 1:
        return f"{column} {op} {literal}"
    rest = compare(chunk_key[1:], op, key[1:])
    return f"({column} {op[0]} {literal} OR ({column} = {literal} AND {rest}))"


def range_condition(chunk_key: Sequence[str], key_range: KeyRange) -> str | None:
    """The key-range part of a predicate; None when the range is unbounded both ways.

    >>> range_condition(["id"], KeyRange.of((1,), (10,)))
    '`id` >= 1 AND `id` < 10'
    >>> range_condition(["id"], KeyRange.through(None, (10,)))
    '`id` <= 10'
    >>> range_condition(["id"], KeyRange.all()) is None
    True
    """
    parts = []
    if key_range.start is not None:
        parts.append(compare(chunk_key, ">=", key_range.start))
    if key_range.end is not None:
        parts.append(compare(chunk_key, "<=" if key_range.end_inclusive else "<", key_range.end))
    return " AND ".join(parts) or None


def chunk_predicate(
    chunk_key: Sequence[str],
    key_range: KeyRange,
    columns: Sequence[ColumnLike | str] | None = None,
    where: str | None = None,
) -> str:
    """SQL text selecting a chunk's rows: usable as ``SELECT ... FROM t WHERE <this>``.

    Args:
        chunk_key: the key columns, in index order.
        key_range: the chunk's range.
        columns: column descriptions (the key's, or the whole table's: key columns
            are picked by name) or the key's bare data types, to check the bounds'
            value types against; None skips the check.
        where: the table's configured filter, ANDed in parentheses.

    >>> chunk_predicate(["id"], KeyRange.of((1,), (10,)), ["bigint"])
    '`id` >= 1 AND `id` < 10'
    >>> chunk_predicate(["a", "b"], KeyRange.through((1, "x"), (2, "y")), where="deleted = 0") == (
    ...     "((`a` > 1 OR (`a` = 1 AND `b` >= 'x')) AND (`a` < 2 OR (`a` = 2 AND `b` <= 'y')))"
    ...     " AND (deleted = 0)")
    True
    >>> chunk_predicate(["id"], KeyRange.all())
    '1 = 1'
    """
    if columns is not None:
        key_columns = key_columns_of(chunk_key, columns)
        for bound in (key_range.start, key_range.end):
            if bound is not None:
                check_key(key_columns, bound)
    condition = range_condition(chunk_key, key_range)
    if where is None or not where.strip():
        return condition or "1 = 1"
    if condition is None:
        return f"({where})"
    return f"({condition}) AND ({where})"


# ------------------------------------------------------------------ planning queries


def _select_key(chunk_key: Sequence[str]) -> str:
    return ", ".join(quote_identifier(c) for c in chunk_key)


def edge_keys_sql(table: str, chunk_key: Sequence[str]) -> str:
    """The smallest and the largest key in one statement: two index dives, each row tagged (0, 1)
    in a first column whose name no key column has; no rows for an empty table.

    >>> edge_keys_sql("s.t", ["id"])  # doctest: +NORMALIZE_WHITESPACE
    'SELECT * FROM (SELECT 0 AS `__tm_edge`, `id` FROM `s`.`t` ORDER BY `id` LIMIT 1) AS tm_lo
     UNION ALL SELECT * FROM (SELECT 1 AS `__tm_edge`, `id` FROM `s`.`t` ORDER BY `id` DESC LIMIT 1)
     AS tm_hi'
    """
    tag = "__tm_edge"
    while tag in {c.lower() for c in chunk_key}:
        tag = "_" + tag
    ends = []
    for number, direction in enumerate(("", " DESC")):
        order = ", ".join(quote_identifier(c) + direction for c in chunk_key)
        ends.append(
            f"SELECT * FROM (SELECT {number} AS {quote_identifier(tag)}, {_select_key(chunk_key)} "
            f"FROM {quote_table(table)} ORDER BY {order} LIMIT 1) AS tm_{('lo', 'hi')[number]}"
        )
    return " UNION ALL ".join(ends)


def boundary_sql(
    table: str, chunk_key: Sequence[str], start: Key | None, last: Key, offset: int
) -> str:
    """The key ``offset`` places after ``start`` (from the first key when None), not past ``last``.

    One index walk of ``offset + 1`` entries, starting at ``start``.

    >>> boundary_sql("s.t", ["id"], (10,), (99,), 100)
    'SELECT `id` FROM `s`.`t` WHERE `id` >= 10 AND `id` <= 99 ORDER BY `id` LIMIT 1 OFFSET 100'
    """
    if offset < 1:
        raise ValueError(f"offset must be at least 1, found {offset}")
    condition = range_condition(chunk_key, KeyRange.through(start, last))
    return (
        f"SELECT {_select_key(chunk_key)} FROM {quote_table(table)} WHERE {condition} "
        f"ORDER BY {_select_key(chunk_key)} LIMIT 1 OFFSET {offset}"
    )


def count_sql(table: str, chunk_key: Sequence[str], key_range: KeyRange) -> str:
    """``COUNT(*)`` of a key range (the whole table for `KeyRange.all`).

    >>> count_sql("s.t", ["id"], KeyRange.all())
    'SELECT COUNT(*) FROM `s`.`t`'
    """
    condition = range_condition(chunk_key, key_range)
    suffix = f" WHERE {condition}" if condition else ""
    return f"SELECT COUNT(*) FROM {quote_table(table)}{suffix}"


def backslash_escapes_off(sql_mode: str | None) -> bool:
    """Whether a ``sql_mode`` value makes backslashes literal in strings.

    >>> backslash_escapes_off("STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES"), backslash_escapes_off("")
    (True, False)
    """
    return "NO_BACKSLASH_ESCAPES" in (sql_mode or "").upper().split(",")
