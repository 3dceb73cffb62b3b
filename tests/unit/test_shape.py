"""A TABLE_MAP's optional metadata (`orchestrator.binlog.metadata`) and its comparison with
the planned columns (`orchestrator.binlog.shape.metadata_difference`), on blocks built by
hand from the format description; the real server's are in integration/test_binlog.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.binlog import metadata as md
from orchestrator.binlog import rowdecode as rd
from orchestrator.binlog import versioned
from orchestrator.binlog.events import TableMap
from orchestrator.binlog.shape import metadata_difference, shape_difference
from orchestrator.schema import charsets
from orchestrator.schema.tables import ColumnInfo, TableInfo

COLLATIONS = {"utf8mb4_general_ci": 45, "latin1_swedish_ci": 8, "utf8mb4_bin": 46}


def lenenc(value: int) -> bytes:
    return bytes([value]) if value < 251 else b"\xfc" + value.to_bytes(2, "little")


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + lenenc(len(value)) + value


def strings(*values: bytes) -> bytes:
    return b"".join(lenenc(len(v)) + v for v in values)


def ints(*values: int) -> bytes:
    return b"".join(lenenc(v) for v in values)


def column(
    name: str,
    data_type: str,
    column_type: str,
    charset: str | None = None,
    collation: str | None = None,
) -> ColumnInfo:
    return ColumnInfo(name, data_type, column_type, True, charset=charset, collation=collation)


# id INT, u INT UNSIGNED, y YEAR, v VARCHAR(10) utf8mb4, l CHAR(3) latin1, b VARBINARY(4),
# e ENUM('a','b'), s SET('x','y') latin1
COLUMNS = (
    column("id", "int", "int(11)"),
    column("u", "int", "int(10) unsigned"),
    column("y", "year", "year(4)"),
    column("v", "varchar", "varchar(10)", "utf8mb4", "utf8mb4_general_ci"),
    column("l", "char", "char(3)", "latin1", "latin1_swedish_ci"),
    column("b", "varbinary", "varbinary(4)"),
    column("e", "enum", "enum('a','b')", "utf8mb4", "utf8mb4_general_ci"),
    column("s", "set", "set('x','y')", "latin1", "latin1_swedish_ci"),
)
INFO = TableInfo("d", "t", COLUMNS, ("id",), (), 0)
TYPES = bytes([rd.LONG, rd.LONG, rd.YEAR, rd.VARCHAR, rd.STRING, rd.VARCHAR, rd.STRING, rd.STRING])
META = (
    b"",
    b"",
    b"",
    b"\x28\x00",
    b"\xfe\x03",
    b"\x04\x00",
    bytes([rd.ENUM, 1]),
    bytes([rd.SET, 1]),
)
FULL = {
    "signedness": tlv(1, bytes([0b0110_0000])),  # id signed, u unsigned, y unsigned (YEAR)
    "charsets": tlv(2, ints(45, 1, 8, 2, 63)),  # default 45; character column 1 latin1, 2 binary
    "names": tlv(4, strings(b"id", b"u", b"y", b"v", b"l", b"b", b"e", b"s")),
    "set": tlv(5, ints(2) + strings(b"x", b"y")),
    "enum": tlv(6, ints(2) + strings(b"a", b"b")),
    "enum_set_charsets": tlv(11, ints(45, 8)),
    "primary key": tlv(8, ints(0)),  # skipped
}


def table_map(**replaced: bytes) -> TableMap:
    block = b"".join(replaced.get(name, value) for name, value in FULL.items())
    return TableMap(18, "d.t", TYPES, META, b"", block)


def difference(**replaced: bytes) -> str | None:
    return metadata_difference(INFO, table_map(**replaced), COLLATIONS, mariadb=True)


def test_the_full_block_parses() -> None:
    types = [rd.real_type(k, m) for k, m in zip(TYPES, META, strict=True)]
    found = md.parse(table_map().optional, types, mariadb=True)
    assert found.names == ("id", "u", "y", "v", "l", "b", "e", "s")
    assert found.unsigned == (False, True, True)
    assert found.collations == (45, 8, 63)
    assert found.enum_set_collations == (45, 8)
    assert found.enum_labels == ((b"a", b"b"),) and found.set_labels == ((b"x", b"y"),)


def test_a_system_versioned_table_never_has_its_shape() -> None:
    """Its rows events hold history rows, whatever their columns: the table is re-read."""
    table_map = TableMap(18, "d.t", TYPES, META, b"")
    assert shape_difference(INFO, table_map) is None
    assert shape_difference(replace(INFO, versioned=True), table_map) == (
        "a system-versioned table: its rows events hold history rows"
    )


def test_a_system_versioned_table_has_the_shape_its_rows_are_applied_in() -> None:
    """Its period end a TIMESTAMP(6): declared (planned), or hidden and logged after its columns
    (`versioned.logged`); by transaction ids, never (its changes are statements anyway)."""
    implicit = replace(INFO, versioned=True)
    logged = versioned.logged(implicit)
    assert [c.name for c in logged.columns[-2:]] == ["row_start", "row_end"]
    kinds = TYPES + bytes([rd.TIMESTAMP2, rd.TIMESTAMP2])
    table_map = TableMap(18, "d.t", kinds, (*META, b"\x06", b"\x06"), b"")
    assert shape_difference(logged, table_map) is None
    assert versioned.end_index(implicit) == len(COLUMNS) + 1
    ends = column("re", "bigint", "bigint(20) unsigned")
    by_trx = replace(INFO, columns=(*COLUMNS, ends), versioned=True, row_end="re")
    assert not versioned.applied(versioned.logged(by_trx))
    assert shape_difference(
        by_trx, TableMap(18, "d.t", TYPES + bytes([rd.LONGLONG]), (*META, b""), b"")
    )


def test_the_planned_shape_has_no_difference() -> None:
    assert difference() is None
    assert (
        metadata_difference(INFO, TableMap(18, "d.t", TYPES, META, b""), COLLATIONS, mariadb=False)
        is None
    )  # MINIMAL without fields: types only


@pytest.mark.parametrize(
    ("replaced", "message"),
    [
        (
            {"names": tlv(4, strings(b"id", b"u", b"y", b"l", b"v", b"b", b"e", b"s"))},
            "columns (id, u, y, l, v, b, e, s) in the binlog but (id, u, y, v, l, b, e, s)",
        ),
        (
            {"names": tlv(4, strings(b"id", b"U", b"y", b"v", b"l", b"b", b"e", b"s"))},
            "columns (id, U, y",
        ),
        (
            {"signedness": tlv(1, bytes([0b0010_0000]))},
            "column `u` is signed in the binlog but int(10) unsigned",
        ),
        (
            {"signedness": tlv(1, bytes([0b1110_0000]))},
            "column `id` is unsigned in the binlog but int(11)",
        ),
        (
            {"charsets": tlv(2, ints(45, 2, 63))},
            "column `l` has collation id 45 in the binlog but latin1_swedish_ci",
        ),
        ({"charsets": tlv(3, ints(46, 8, 63))}, "column `v` has collation id 46"),
        (
            {"charsets": tlv(2, ints(45, 1, 8))},
            "column `b` has collation id 45 in the binlog but binary",
        ),
        ({"enum_set_charsets": tlv(10, ints(45))}, "column `s` has collation id 45"),
        (
            {"enum": tlv(6, ints(3) + strings(b"a", b"b", b"c"))},
            "column `e` has the labels of another ENUM in the binlog than enum('a','b')",
        ),
        ({"enum": tlv(6, ints(2) + strings(b"b", b"a"))}, "another ENUM"),
        (
            {"set": tlv(5, ints(2) + strings(b"x", b"z"))},
            "another SET in the binlog than set('x','y')",
        ),
    ],
)
def test_each_difference_is_named(replaced: dict[str, bytes], message: str) -> None:
    found = difference(**replaced)
    assert found is not None and message in found, found


def test_labels_decode_in_the_columns_charset() -> None:
    latin = (
        column("id", "int", "int(11)"),
        column("e", "enum", "enum('é','x')", "latin1", "latin1_swedish_ci"),
    )
    info = TableInfo("d", "t", latin, ("id",), (), 0)
    block = tlv(6, ints(2) + strings("é".encode("latin1"), b"x")) + tlv(10, ints(8))
    kinds, meta = bytes([rd.LONG, rd.STRING]), (b"", bytes([rd.ENUM, 1]))
    assert (
        metadata_difference(
            info, TableMap(1, "d.t", kinds, meta, b"", block), COLLATIONS, mariadb=True
        )
        is None
    )
    # latin1's five bytes cp1252 leaves undefined are C1 controls to the server, as built in
    c1 = (latin[0], column("e", "enum", "enum('\x81','x')", "latin1", "latin1_swedish_ci"))
    block = tlv(6, ints(2) + strings(b"\x81", b"x")) + tlv(10, ints(8))
    found = TableInfo("d", "t", c1, ("id",), (), 0)
    assert (
        metadata_difference(
            found, TableMap(1, "d.t", kinds, meta, b"", block), COLLATIONS, mariadb=True
        )
        is None
    )


def test_labels_in_a_set_read_from_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded with what the server answered (`orchestrator.schema.charsets`); the count only,
    when the set was not read in this process."""
    monkeypatch.setattr(charsets, "_loaded", {})
    monkeypatch.setattr(charsets, "_failed", {})
    kinds, meta = bytes([rd.LONG, rd.STRING]), (b"", bytes([rd.ENUM, 1]))
    koi8r = (
        column("id", "int", "int(11)"),
        column("e", "enum", "enum('Ъ','x')", "koi8r", "koi8r_general_ci"),
    )
    info = TableInfo("d", "t", koi8r, ("id",), (), 0)

    def labels(*values: bytes) -> TableMap:
        block = tlv(6, ints(2) + strings(*values))
        return TableMap(1, "d.t", kinds, meta, b"", block)

    assert metadata_difference(info, labels(b"\xff", b"y"), COLLATIONS, mariadb=True) is None
    charsets._loaded["koi8r"] = lambda raw: raw.decode("koi8_r")
    assert metadata_difference(info, labels(b"\xff", b"x"), COLLATIONS, mariadb=True) is None
    found = metadata_difference(info, labels(b"\xfe", b"x"), COLLATIONS, mariadb=True)
    assert found is not None and "another ENUM" in found, found


def test_geometry_is_a_character_column_in_mariadb_only() -> None:
    kinds = [rd.GEOMETRY, rd.VARCHAR]
    block = tlv(3, ints(63, 45))
    assert md.parse(block, kinds, mariadb=True).collations == (63, 45)
    assert md.parse(tlv(2, ints(45)), kinds, mariadb=False).collations == (45,)


@pytest.mark.parametrize(
    "block", [tlv(4, strings(b"id"))[:-1] + b"", bytes([2, 5, 45]), tlv(2, ints(45, 9, 8))]
)
def test_a_damaged_block_is_an_error_not_a_pass(block: bytes) -> None:
    with pytest.raises(ValueError):
        md.parse(block, [rd.LONG, rd.VARCHAR], mariadb=True)


def test_damaged_metadata_is_a_difference() -> None:
    found = difference(charsets=tlv(2, ints(45, 9, 8)))
    assert found == "optional metadata that does not parse: a charset for character column 9 of 3"


def test_labels_information_schema_lost_need_the_binlogs_own() -> None:
    """information_schema prints an ENUM label's four-byte characters as '?': a binlog value
    (an index) of such a column is named only by the binlog's labels (FULL metadata), and
    compared with them; without them the table is re-read. A literal '?' label the binlog
    confirms is no difference."""
    kinds, meta = bytes([rd.LONG, rd.STRING]), (b"", bytes([rd.ENUM, 1]))
    emoji = (
        column("id", "int", "int(11)"),
        column("e", "enum", "enum('é?','x')", "utf8mb4", "utf8mb4_general_ci"),
    )
    info = TableInfo("d", "t", emoji, ("id",), (), 0)
    bare = TableMap(1, "d.t", kinds, meta, b"")
    found = metadata_difference(info, bare, COLLATIONS, mariadb=True)
    assert found is not None and "column `e` has ENUM labels that information_schema" in found
    minimal = TableMap(1, "d.t", kinds, meta, b"", tlv(1, bytes([0])))  # signedness only
    assert metadata_difference(info, minimal, COLLATIONS, mariadb=True) == found
    literal = tlv(6, ints(2) + strings("é?".encode(), b"x"))
    assert (
        metadata_difference(
            info, TableMap(1, "d.t", kinds, meta, b"", literal), COLLATIONS, mariadb=True
        )
        is None
    )
    four = tlv(6, ints(2) + strings("é😀".encode(), b"x"))
    found = metadata_difference(
        info, TableMap(1, "d.t", kinds, meta, b"", four), COLLATIONS, mariadb=True
    )
    assert found is not None and "another ENUM" in found
    latin = (emoji[0], column("e", "enum", "enum('é?','x')", "latin1", "latin1_swedish_ci"))
    assert (
        metadata_difference(
            TableInfo("d", "t", latin, ("id",), (), 0), bare, COLLATIONS, mariadb=True
        )
        is None
    )
