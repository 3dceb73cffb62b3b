"""The MySQL dialect: literals (hostile values), identifiers, comparisons, predicates, queries."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chunking.keys import KeyValue
from chunking.mysql import (
    backslash_escapes_off,
    boundary_sql,
    check_key,
    chunk_predicate,
    compare,
    count_sql,
    edge_keys_sql,
    quote_identifier,
    quote_table,
    sql_literal,
    unsupported_key_reason,
)
from chunking.ranges import KeyRange
from orchestrator.schema.tables import ColumnInfo

LITERALS: list[tuple[KeyValue, str]] = [
    ("plain", "'plain'"),
    ("", "''"),
    ("O'Brien", "'O\\'Brien'"),
    ('say "hi"', "'say \\\"hi\\\"'"),
    ("back\\slash", "'back\\\\slash'"),
    ("\\'", "'\\\\\\''"),  # a backslash then a quote: neither may escape the other
    ("100%_done", "'100%_done'"),  # LIKE wildcards are ordinary outside LIKE
    ("nul\0byte", "'nul\\0byte'"),
    ("line\nfeed\rreturn", "'line\\nfeed\\rreturn'"),
    ("ctrl-z\x1a", "'ctrl-z\\Z'"),
    ("emoji 😀 and ünïcödé", "'emoji 😀 and ünïcödé'"),
    ("'; DROP TABLE t; --", "'\\'; DROP TABLE t; --'"),
    (0, "0"),
    (-1, "-1"),
    (18446744073709551615, "18446744073709551615"),
    (-9223372036854775808, "-9223372036854775808"),
    (True, "1"),
    (False, "0"),
    (Decimal("123.4500"), "123.4500"),
    (Decimal("-0.000001"), "-0.000001"),
    (Decimal("1E+5"), "100000"),
    (
        Decimal("99999999999999999999999999999999999999.99"),
        "99999999999999999999999999999999999999.99",
    ),
    (1.5, "1.5"),
    (-2.5e-300, "-2.5e-300"),
    (b"", "X''"),
    (b"\x00\x01'\\\xff", "X'0001275cff'"),
    (date(2024, 2, 29), "DATE'2024-02-29'"),
    (datetime(2024, 1, 2, 3, 4, 5), "TIMESTAMP'2024-01-02 03:04:05.000000'"),
    (datetime(1000, 1, 1, 0, 0, 0, 1), "TIMESTAMP'1000-01-01 00:00:00.000001'"),
    (time(23, 59, 59, 999999), "TIME'23:59:59.999999'"),
    (timedelta(hours=838, minutes=59, seconds=59), "TIME'838:59:59.000000'"),
    (-timedelta(hours=838, minutes=59, seconds=59), "TIME'-838:59:59.000000'"),
    (-timedelta(seconds=1, microseconds=500000), "TIME'-00:00:01.500000'"),
    (None, "NULL"),
]


@pytest.mark.parametrize(("value", "literal"), LITERALS)
def test_sql_literal(value: KeyValue, literal: str) -> None:
    assert sql_literal(value) == literal


def test_very_long_string_is_escaped_throughout() -> None:
    value = ("ab'\\" * 50_000) + "\0"
    literal = sql_literal(value)
    assert literal == "'" + "ab\\'\\\\" * 50_000 + "\\0'"


@given(st.text())
def test_no_string_can_end_its_literal_early(value: str) -> None:
    literal = sql_literal(value)
    assert literal[0] == literal[-1] == "'"
    body = literal[1:-1]
    # walk the body as MySQL does: every quote must be escaped, and no raw specials remain
    i = 0
    while i < len(body):
        if body[i] == "\\":
            assert i + 1 < len(body), "a trailing backslash would escape the closing quote"
            assert body[i + 1] in "\\'\"0nrZ"
            i += 2
            continue
        assert body[i] not in "'\"\0\n\r\x1a"
        i += 1


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        Decimal("NaN"),
        Decimal("-Infinity"),
        datetime(2024, 1, 1, tzinfo=UTC),
        time(1, 0, tzinfo=UTC),
    ],
)
def test_values_without_a_faithful_literal_are_refused(value: KeyValue) -> None:
    with pytest.raises(ValueError):
        sql_literal(value)


def test_unknown_types_are_refused() -> None:
    with pytest.raises(TypeError, match="list"):
        sql_literal([1])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("id", "`id`"),
        ("order id", "`order id`"),
        ("a`b", "`a``b`"),
        ("ключ", "`ключ`"),
    ],
)
def test_quote_identifier(name: str, quoted: str) -> None:
    assert quote_identifier(name) == quoted


def test_quote_table_needs_a_database() -> None:
    assert quote_table("db.t") == "`db`.`t`"
    with pytest.raises(ValueError, match=r"database\.table"):
        quote_table("t")


@pytest.mark.parametrize(
    ("key", "op", "value", "sql"),
    [
        (["id"], ">=", (5,), "`id` >= 5"),
        (["id"], "<", (-5,), "`id` < -5"),
        (["a", "b"], ">=", (1, "x"), "(`a` > 1 OR (`a` = 1 AND `b` >= 'x'))"),
        (["a", "b"], "<=", (1, "x"), "(`a` < 1 OR (`a` = 1 AND `b` <= 'x'))"),
        (
            ["a", "b", "c"],
            ">",
            (1, 2, 3),
            "(`a` > 1 OR (`a` = 1 AND (`b` > 2 OR (`b` = 2 AND `c` > 3))))",
        ),
    ],
)
def test_compare_spells_out_row_comparisons(
    key: list[str], op: str, value: tuple[KeyValue, ...], sql: str
) -> None:
    assert compare(key, op, value) == sql  # type: ignore[arg-type]


def test_compare_needs_matching_arity() -> None:
    with pytest.raises(ValueError):
        compare(["a", "b"], ">=", (1,))


@pytest.mark.parametrize(
    ("key_range", "where", "sql"),
    [
        (KeyRange.all(), None, "1 = 1"),
        (KeyRange.all(), "x > 1", "(x > 1)"),
        (KeyRange.of(None, (10,)), None, "`id` < 10"),
        (KeyRange.of((10,), None), None, "`id` >= 10"),
        (KeyRange.of((10,), (20,)), None, "`id` >= 10 AND `id` < 20"),
        (KeyRange.through((10,), (20,)), None, "`id` >= 10 AND `id` <= 20"),
        (KeyRange.through(None, (20,)), "  ", "`id` <= 20"),
        (
            KeyRange.of((10,), (20,)),
            "a = 1 OR b = 2",
            "(`id` >= 10 AND `id` < 20) AND (a = 1 OR b = 2)",
        ),
    ],
)
def test_chunk_predicate(key_range: KeyRange, where: str | None, sql: str) -> None:
    assert chunk_predicate(["id"], key_range, ["bigint"], where) == sql


def test_chunk_predicate_picks_key_columns_from_the_whole_table() -> None:
    columns = [
        ColumnInfo("note", "text", "text", True),
        ColumnInfo("B", "varchar", "varchar(9)", False),
        ColumnInfo("a", "int", "int(11)", False),
    ]
    predicate = chunk_predicate(["a", "b"], KeyRange.of((1, "x"), (2, "y")), columns)
    assert predicate.startswith("(`a` > 1 OR")
    with pytest.raises(TypeError, match="`B`"):
        chunk_predicate(["a", "b"], KeyRange.of((1, 2), None), columns)
    with pytest.raises(ValueError, match="missing"):
        chunk_predicate(["a", "missing"], KeyRange.all(), columns)


CHECKS: list[tuple[str, KeyValue, bool]] = [
    ("bigint", 1, True),
    ("bigint", "1", False),
    ("bigint", True, False),
    ("bigint", Decimal(1), False),
    ("year", 2024, True),
    ("varchar", "x", True),
    ("char", 1, False),
    ("varchar", b"x", False),
    ("varbinary", b"x", True),
    ("binary", "x", False),
    ("decimal", Decimal("1.5"), True),
    ("decimal", 2, True),
    ("decimal", "1.5", False),
    ("double", 1.5, True),
    ("date", date(2020, 1, 1), True),
    ("date", datetime(2020, 1, 1), False),
    ("date", "0000-00-00", True),
    ("datetime", datetime(2020, 1, 1), True),
    ("datetime", date(2020, 1, 1), False),
    ("timestamp", datetime(2020, 1, 1), True),
    ("time", timedelta(hours=-1), True),
    ("time", time(1), True),
    ("time", 5, False),
]


@pytest.mark.parametrize(("data_type", "value", "fits"), CHECKS)
def test_check_key(data_type: str, value: KeyValue, fits: bool) -> None:
    if fits:
        check_key([data_type], (value,))
    else:
        with pytest.raises(TypeError):
            check_key([data_type], (value,))


@pytest.mark.parametrize(
    ("data_type", "supported"),
    [
        ("int", True),
        ("bigint", True),
        ("varchar", True),
        ("char", True),
        ("varbinary", True),
        ("decimal", True),
        ("double", True),
        ("date", True),
        ("datetime", True),
        ("timestamp", True),
        ("time", True),
        ("year", True),
        ("enum", False),
        ("set", False),
        ("bit", False),
        ("json", False),
        ("geometry", False),
        ("point", False),
    ],
)
def test_supported_key_types(data_type: str, supported: bool) -> None:
    assert (unsupported_key_reason(data_type) is None) == supported


@pytest.mark.parametrize(
    ("data_type", "collation", "supported"),
    [
        ("char", "utf8mb4_general_ci", True),
        ("char", "utf8mb4_bin", True),
        ("varchar", "utf8mb4_nopad_bin", True),
        ("char", "utf8mb4_nopad_bin", False),
        ("char", "latin1_NOPAD_bin", False),
        ("char", "utf8mb4_unicode_520_nopad_ci", False),
        ("char", None, True),
    ],
)
def test_char_with_no_pad_collations_is_refused(
    data_type: str, collation: str | None, supported: bool
) -> None:
    assert (unsupported_key_reason(data_type, collation) is None) == supported


def test_planning_queries() -> None:
    assert edge_keys_sql("d.t", ["a", "b"]) == (
        "SELECT * FROM (SELECT 0 AS `__tm_edge`, `a`, `b` FROM `d`.`t` ORDER BY `a`, `b` LIMIT 1) "
        "AS tm_lo UNION ALL "
        "SELECT * FROM (SELECT 1 AS `__tm_edge`, `a`, `b` FROM `d`.`t` "
        "ORDER BY `a` DESC, `b` DESC LIMIT 1) AS tm_hi"
    )
    assert "`___tm_edge`" in edge_keys_sql("d.t", ["__TM_edge"])  # never a key column's name
    assert boundary_sql("d.t", ["a"], None, ("z",), 50) == (
        "SELECT `a` FROM `d`.`t` WHERE `a` <= 'z' ORDER BY `a` LIMIT 1 OFFSET 50"
    )
    assert (
        count_sql("d.t", ["a"], KeyRange.of(("m",), None))
        == "SELECT COUNT(*) FROM `d`.`t` WHERE `a` >= 'm'"
    )
    with pytest.raises(ValueError):
        boundary_sql("d.t", ["a"], None, ("z",), 0)


@pytest.mark.parametrize(
    ("mode", "off"),
    [
        ("", False),
        (None, False),
        ("STRICT_TRANS_TABLES", False),
        ("NO_BACKSLASH_ESCAPES", True),
        ("ansi,no_backslash_escapes", True),
        ("NO_BACKSLASH_ESCAPES_X", False),
    ],
)
def test_backslash_escapes_off(mode: str | None, off: bool) -> None:
    assert backslash_escapes_off(mode) is off
