"""The binlog adapter against a real MariaDB: ops, positions, filtering, rotation, stop,
purged binlogs, and every type of the mapping equal to what SELECT returns."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.binlog.reference import BinlogReader, Boundary, Record, RowChange, TableChange
from orchestrator.config import SourceConfig, parse_config
from orchestrator.errors import BinlogPurged, RunFailed
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import BatchConverter
from orchestrator.source.connection import Source
from orchestrator.state.store import StateStore
from tests.conftest import fresh_database, pipeline_config

pytestmark = pytest.mark.integration


def source_config(server: LocalMariaDB, server_id: int = 54011) -> SourceConfig:
    return SourceConfig(host="127.0.0.1", port=server.port, user="root", server_id=server_id)


def position(server: LocalMariaDB) -> BinlogPosition:
    with Source(source_config(server), "") as source:
        return source.current_position()


def table_info(server: LocalMariaDB, name: str) -> TableInfo:
    with Source(source_config(server), "") as source:
        return source.table_info(name)


def read(
    server: LocalMariaDB,
    start: BinlogPosition,
    names: list[str],
    stop: BinlogPosition | None = None,
) -> list[Record]:
    tables = {name: table_info(server, name) for name in names}
    with BinlogReader(source_config(server), "", start, tables, stop=stop) as reader:
        return list(reader)


def changes(records: list[Record]) -> list[RowChange]:
    return [r for r in records if isinstance(r, RowChange)]


# --------------------------------------------------------------------------- ops and positions


def test_ops_before_images_and_positions_in_order(mariadb: LocalMariaDB) -> None:
    fresh_database(
        mariadb,
        "cap_ops",
        "CREATE TABLE cap_ops.t (id INT PRIMARY KEY, v VARCHAR(10))",
        "CREATE TABLE cap_ops.other (id INT PRIMARY KEY)",
    )
    fresh_database(
        mariadb, "cap_ops_other", "CREATE TABLE cap_ops_other.t (id INT PRIMARY KEY, v VARCHAR(10))"
    )
    start = position(mariadb)
    mariadb.execute("INSERT INTO cap_ops.t VALUES (1, 'a'), (2, 'b')")
    middle = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_ops_other.t VALUES (1, 'zz')",  # same table name, other schema
        "INSERT INTO cap_ops.other VALUES (1)",
        "UPDATE cap_ops.t SET v = 'c' WHERE id = 1",
    )
    mariadb.execute(
        "BEGIN",
        "UPDATE cap_ops.t SET id = 20 WHERE id = 2",  # a key change
        "INSERT INTO cap_ops_other.t VALUES (2, 'q')",
        "DELETE FROM cap_ops.t WHERE id = 1",
        "COMMIT",
    )
    stop = position(mariadb)

    records = read(mariadb, start, ["cap_ops.t"], stop)
    got = [(c.table, c.op, c.after, c.before) for c in changes(records)]
    assert got == [
        ("cap_ops.t", "I", (1, b"a"), None),
        ("cap_ops.t", "I", (2, b"b"), None),
        ("cap_ops.t", "U", (1, b"c"), (1, b"a")),
        ("cap_ops.t", "U", (20, b"b"), (2, b"b")),
        ("cap_ops.t", "D", None, (1, b"c")),
    ]
    found = changes(records)
    positions = [c.position for c in found]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # One multi-row event: same end position, rows 0 and 1.
    assert positions[1].pos == positions[0].pos and (positions[0].row, positions[1].row) == (0, 1)
    # "After L" is position > L for an L from SHOW MASTER STATUS.
    assert all(p < middle for p in positions[:2]) and all(p > middle for p in positions[2:])
    assert all(start < p < stop for p in positions)
    # The key change and the delete share a transaction: no boundary between them.
    kinds = ["B" if isinstance(r, Boundary) else r.op for r in records]
    assert kinds[-4:] == ["U", "D", "B", "B"]
    assert records[-1] == Boundary(stop, "stop")
    assert isinstance(records[-2], Boundary) and records[-2].position.key == stop.key


def test_only_the_given_tables(mariadb: LocalMariaDB) -> None:
    fresh_database(
        mariadb,
        "cap_filter",
        "CREATE TABLE cap_filter.a (id INT PRIMARY KEY)",
        "CREATE TABLE cap_filter.b (id INT PRIMARY KEY)",
    )
    start = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_filter.a VALUES (1)",
        "INSERT INTO cap_filter.b VALUES (2)",
        "INSERT INTO cap_filter.a VALUES (3)",
    )
    stop = position(mariadb)
    assert [c.after for c in changes(read(mariadb, start, ["cap_filter.b"], stop))] == [(2,)]
    both = changes(read(mariadb, start, ["cap_filter.a", "cap_filter.b"], stop))
    assert [(c.table, c.after) for c in both] == [
        ("cap_filter.a", (1,)),
        ("cap_filter.b", (2,)),
        ("cap_filter.a", (3,)),
    ]


# --------------------------------------------------------------------------- rotation, stop


def test_rotation_mid_stream(mariadb: LocalMariaDB) -> None:
    fresh_database(mariadb, "cap_rot", "CREATE TABLE cap_rot.t (id INT PRIMARY KEY)")
    start = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_rot.t VALUES (1)",
        "FLUSH BINARY LOGS",
        "INSERT INTO cap_rot.t VALUES (2), (3)",
        "FLUSH BINARY LOGS",
        "INSERT INTO cap_rot.t VALUES (4)",
    )
    stop = position(mariadb)
    records = read(mariadb, start, ["cap_rot.t"], stop)
    found = changes(records)
    assert [c.after for c in found] == [(1,), (2,), (3,), (4,)]
    files = [c.position.file for c in found]
    assert files[0] == start.file and files[3] == stop.file
    assert len({files[0], files[1], files[3]}) == 3 and files[1] == files[2]
    assert [c.position for c in found] == sorted(c.position for c in found)
    rotations = [r.position for r in records if isinstance(r, Boundary) and r.kind == "rotate"]
    assert [(p.file, p.pos) for p in rotations] == [(files[1], 4), (files[3], 4)]


def test_stop_position_is_respected(mariadb: LocalMariaDB) -> None:
    fresh_database(mariadb, "cap_stop", "CREATE TABLE cap_stop.t (id INT PRIMARY KEY)")
    start = position(mariadb)
    mariadb.execute("INSERT INTO cap_stop.t VALUES (1)", "INSERT INTO cap_stop.t VALUES (2)")
    stop = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_stop.t VALUES (3)",
        "FLUSH BINARY LOGS",
        "INSERT INTO cap_stop.t VALUES (4)",
    )
    records = read(mariadb, start, ["cap_stop.t"], stop)
    assert [c.after for c in changes(records)] == [(1,), (2,)]
    assert records[-1] == Boundary(stop, "stop")
    assert all(r.position <= stop for r in records)
    # Nothing between a position and itself; no stop reads to the end of the binlog.
    assert read(mariadb, stop, ["cap_stop.t"], stop) == [Boundary(stop, "stop")]
    assert [c.after for c in changes(read(mariadb, stop, ["cap_stop.t"]))] == [(3,), (4,)]


def test_changed_table_shape_is_a_table_change(mariadb: LocalMariaDB) -> None:
    """The ALTER and the TABLE_MAP of the new shape are both reported; the rows after them
    are left out (the table must be read again)."""
    fresh_database(
        mariadb,
        "cap_shape",
        "CREATE TABLE cap_shape.t (id INT PRIMARY KEY)",
        "CREATE TABLE cap_shape.u (id INT PRIMARY KEY)",
    )
    infos = {name: table_info(mariadb, name) for name in ("cap_shape.t", "cap_shape.u")}
    start = position(mariadb)
    mariadb.execute(
        "INSERT INTO cap_shape.t VALUES (7)",
        "ALTER TABLE cap_shape.t ADD COLUMN v INT",
        "INSERT INTO cap_shape.t VALUES (1, 2)",
        "INSERT INTO cap_shape.u VALUES (3)",
    )
    reader = BinlogReader(source_config(mariadb), "", start, infos, stop=position(mariadb))
    with reader:
        records = list(reader)
    kept = [(c.table, c.after) for c in changes(records)]
    assert kept == [("cap_shape.t", (7,)), ("cap_shape.u", (3,))]
    found = [r for r in records if isinstance(r, TableChange)]
    assert [r.tables for r in found] == [frozenset({"cap_shape.t"})] * 2
    assert found[0].what.startswith("DDL `ALTER TABLE cap_shape.t ADD COLUMN v INT")
    assert "TABLE_MAP of another shape (2 columns in the binlog but 1" in found[1].what
    assert found[0].position < found[1].position


def test_compressed_rows_events_are_read(mariadb: LocalMariaDB) -> None:
    """log_bin_compress=ON (also switched on while running): the rows come through."""
    fresh_database(mariadb, "cap_zip", "CREATE TABLE cap_zip.t (id INT PRIMARY KEY, v TEXT)")
    start = position(mariadb)
    mariadb.execute("SET GLOBAL log_bin_compress = ON")
    try:
        mariadb.execute(
            "INSERT INTO cap_zip.t VALUES (1, REPEAT('x', 5000))",
            "UPDATE cap_zip.t SET v = REPEAT('y', 300) WHERE id = 1",
        )
    finally:
        mariadb.execute("SET GLOBAL log_bin_compress = OFF")
    mariadb.execute("DELETE FROM cap_zip.t")
    found = changes(read(mariadb, start, ["cap_zip.t"], position(mariadb)))
    assert [(c.op, c.after) for c in found] == [
        ("I", (1, b"x" * 5000)),
        ("U", (1, b"y" * 300)),
        ("D", None),
    ]


#: (table, ALTER, what the TABLE_MAP check says) for changes the column types alone hide.
METADATA_CHANGES = {
    "enum_append": (
        "e ENUM('a','b')",
        "MODIFY e ENUM('a','b','c')",
        "column `e` has the labels of another ENUM in the binlog than enum('a','b')",
    ),
    "enum_reorder": (
        "e ENUM('a','b')",
        "MODIFY e ENUM('b','a')",
        "column `e` has the labels of another ENUM in the binlog than enum('a','b')",
    ),
    "set_labels": (
        "e SET('a','b')",
        "MODIFY e SET('a','x')",
        "column `e` has the labels of another SET in the binlog than set('a','b')",
    ),
    "swap": (
        "e INT, f INT",
        "RENAME COLUMN e TO f, RENAME COLUMN f TO e",
        "columns (id, f, e) in the binlog but (id, e, f) when it was planned",
    ),
    "rename": ("e INT", "RENAME COLUMN e TO g", "columns (id, g) in the binlog but (id, e)"),
    "charset": (
        "e VARCHAR(10) CHARACTER SET latin1",
        "CONVERT TO CHARACTER SET utf8mb4",
        "column `e` has collation id 45 in the binlog but latin1_swedish_ci as planned",
    ),
    "signedness": (
        "e INT",
        "MODIFY e INT UNSIGNED",
        "column `e` is unsigned in the binlog but int(11) as planned",
    ),
}


@pytest.mark.parametrize("case", list(METADATA_CHANGES))
def test_table_map_metadata_differences_are_table_changes(mariadb: LocalMariaDB, case: str) -> None:
    """binlog_row_metadata=FULL: a TABLE_MAP whose names, signedness, charsets or labels
    differ from the planned columns is a re-read, even with the same column types (the
    ALTER itself lies before the range read here, so only the TABLE_MAP can tell)."""
    columns, alter, message = METADATA_CHANGES[case]
    db = f"cap_meta_{case}"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, {columns})",
        f"CREATE TABLE {db}.same (id INT PRIMARY KEY, {columns})",
    )
    infos = {name: table_info(mariadb, name) for name in (f"{db}.t", f"{db}.same")}
    mariadb.execute(f"ALTER TABLE {db}.t {alter}")
    start = position(mariadb)
    mariadb.execute(f"INSERT INTO {db}.t (id) VALUES (1)", f"INSERT INTO {db}.same (id) VALUES (2)")
    reader = BinlogReader(source_config(mariadb), "", start, infos, stop=position(mariadb))
    with reader:
        records = list(reader)
    found = [r for r in records if isinstance(r, TableChange)]
    assert [r.tables for r in found] == [frozenset({f"{db}.t"})]
    assert found[0].what.startswith("a TABLE_MAP of another shape (")
    assert message in found[0].what, found[0].what
    assert [(c.table, c.after[0]) for c in changes(records)] == [(f"{db}.same", 2)]


def test_a_lost_stream_is_not_silently_reconnected(mariadb: LocalMariaDB) -> None:
    reader = BinlogReader(source_config(mariadb), "", position(mariadb), {})
    settings = {"host": "127.0.0.1", "port": mariadb.port, "user": "root", "password": ""}
    reader._connect(**settings).close()  # the stream's first connection
    reader._connect(**settings, db="information_schema").close()  # control connections are fine
    with pytest.raises(RunFailed, match="lost the binlog connection"):
        reader._connect(**settings)


def purge(server: LocalMariaDB, upto: str) -> None:
    """PURGE BINARY LOGS TO ``upto``, again until it took (MariaDB keeps a file until its
    binlog checkpoint is written, a moment after the rotation)."""
    for _ in range(300):
        server.execute(f"PURGE BINARY LOGS TO '{upto}'")
        if [r[0] for r in server.execute("SHOW BINARY LOGS")] == [upto]:
            return
        time.sleep(0.1)
    raise AssertionError(f"binlogs before {upto} were never purged")


def test_purged_binlog_names_the_file(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = LocalMariaDB.create(base_dir=tmp_path_factory.mktemp("purge"))
    server.start()
    try:
        server.execute("CREATE DATABASE cap_purge", "CREATE TABLE cap_purge.t (id INT PRIMARY KEY)")
        start = position(server)
        server.execute(
            "INSERT INTO cap_purge.t VALUES (1)", "FLUSH BINARY LOGS", "FLUSH BINARY LOGS"
        )
        current = position(server)
        purge(server, current.file)
        with pytest.raises(BinlogPurged) as caught:
            read(server, start, ["cap_purge.t"], current)
        message = str(caught.value)
        assert start.file in message and f"the oldest binlog there is {current.file}" in message

        config = parse_config(pipeline_config(tmp_path, server, [{"name": "cap_purge.t"}]))
        store = StateStore(config.state.url)
        tables = {"cap_purge.t": CaptureTable(table_info(server, "cap_purge.t"), ("id",), start)}
        with pytest.raises(BinlogPurged, match=start.file):
            capture_changes(config, store, store.create_run("test", {}).run_id, tables, current)
    finally:
        server.destroy()


# --------------------------------------------------------------------------- every type

TYPES_DDL = """
CREATE TABLE cap_types.t (
  id INT PRIMARY KEY,
  i8 TINYINT, u8 TINYINT UNSIGNED, i16 SMALLINT, u16 SMALLINT UNSIGNED,
  i24 MEDIUMINT, u24 MEDIUMINT UNSIGNED, i32 INT, u32 INT UNSIGNED,
  i64 BIGINT, u64 BIGINT UNSIGNED, yr YEAR,
  d10 DECIMAL(10,2), d38 DECIMAL(38,10), d65 DECIMAL(65,30),
  f FLOAT, db DOUBLE,
  b1 BIT(1), tf TINYINT(1), b10 BIT(10), b64 BIT(64),
  ch CHAR(5), chl CHAR(3) CHARACTER SET latin1, vc VARCHAR(20), vl VARCHAR(20) CHARACTER SET latin1,
  tx TEXT, mt MEDIUMTEXT CHARACTER SET latin1,
  en ENUM('x','y','z'), st SET('b','a','c'), js JSON,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  dd DATE, dt0 DATETIME, dt6 DATETIME(6), ts0 TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL,
  t0 TIME, t1 TIME(1), t2 TIME(2), t3 TIME(3), t4 TIME(4), t5 TIME(5), t6 TIME(6),
  ip6 INET6, ip4 INET4, uu UUID
) DEFAULT CHARSET = utf8mb4
"""
NINES = "9" * 35 + "." + "9" * 30
TYPES_ROWS = [
    # minimums
    "(1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0, 1901,"
    f" -99999999.99, -9999999999999999999999999999.9999999999, -{NINES}, -3.40282e38,"
    " -1.7976931348623157e308, b'0', 0, b'0', b'0', '', '', '', '', '', '', 'x', '', '{}',"
    " '', '', '', '1000-01-01', '1000-01-01 00:00:00', '1000-01-01 00:00:00.000000',"
    " '1970-01-01 00:00:01', '1970-01-01 00:00:01.001', '-838:59:59', '-838:59:59.9',"
    " '-838:59:59.99', '-838:59:59.999', '-838:59:59.9999', '-838:59:59.99999',"
    " '-838:59:59.999999', '::', '0.0.0.0', '00000000-0000-0000-0000-000000000000')",
    # maximums
    "(2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807,"
    f" 18446744073709551615, 2155, 99999999.99, 9999999999999999999999999999.9999999999, {NINES},"
    " 1234567, 0.1, b'1', 1, b'1111111111', b'" + "1" * 64 + "', 'abc  ', 'é', '😀 x',"
    " CONVERT(x'E981' USING latin1), REPEAT('ü', 300), REPEAT('x', 70000), 'z', 'c,a,b',"
    " '{\"k\": [1, 2.5, \"ü\"]}', 'ab', x'00ff00', x'000102ff', '9999-12-31',"
    " '9999-12-31 23:59:59',"
    " '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07', '2038-01-19 03:14:07.999', '838:59:59',"
    " '838:59:59.9', '838:59:59.99', '838:59:59.999', '838:59:59.9999', '838:59:59.99999',"
    " '838:59:59.999999', 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', '255.255.255.255',"
    " 'ffffffff-ffff-ffff-ffff-ffffffffffff')",
    # odd corners: zero dates, empty SET, invalid ENUM, NUL padding, negative fractions
    "(3, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, 0, 0, 0, 0, -0.0, 5e-324, b'1', 7, b'1000000001',"
    " x'8000000000000001', ' a', 'ñ  ', 'tab\\tnl\\n', CONVERT(x'80' USING latin1), NULL, '',"
    " 'bogus', '', '[]', x'6100', '', '', '0000-00-00', '0000-00-00 00:00:00',"
    " '0000-00-00 00:00:00', '0000-00-00 00:00:00', NULL, '00:00:00', '-00:00:00.1',"
    " '-00:00:01.01', '-00:00:00.001', '-12:34:56.0001', '-00:00:00.00001', '-00:00:00.000001',"
    " '::ffff:1.2.3.4', '10.0.0.0', '10000000-0000-1000-8000-000000000000')",
    # NULL everywhere
    "(4" + ", NULL" * 47 + ")",
    # ordinary values, a DST day in New York, TIME over 24 h
    "(5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 2024, 3.14, 2.5, 1.25, 3.14159265, 2.718281828459045,"
    " b'0', 0, b'101', b'101', 'abc', 'abc', 'abc', 'abc', 'abc', 'abc', 'y', 'a', '{\"a\": 1}',"
    " 'abcd', 'abc', 'abc', '2024-02-29', '2021-03-14 02:30:00', '2021-03-14 02:30:00.5',"
    " '2021-03-14 07:30:00', '2021-03-14 07:30:00.123', '25:00:00', '-25:00:00.5', '100:00:00.25',"
    " '-00:00:00.5', '00:00:00.0001', '-34:00:00.00001', '01:02:03.456789', '2001:db8::1',"
    " '192.168.1.1', '6ccd780c-baba-1026-9564-5b8c656024db')",
]
TYPES_UPDATE = (
    "UPDATE cap_types.t SET u64 = 18446744073709551614, st = 'c', en = 'x',"
    " ts3 = '2021-11-07 05:59:59.999', t6 = '-00:00:00.5', f = 16777217,"
    " bn = x'61', js = '{\"b\": null}', ip6 = '1::',"
    " uu = '018f1e2a-3b4c-7d5e-9f00-112233445566' WHERE id = 5"
)


@pytest.fixture
def new_york_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process runs in America/New_York: TIMESTAMP must still come out as the UTC instant."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def select_rows(server: LocalMariaDB, info: TableInfo) -> list[tuple[Any, ...]]:
    """The table as the server returns it, in the session time zone UTC (as Spark reads it).

    FLOAT is selected as ``CAST(f AS DOUBLE)``: over the text protocol the server prints a
    FLOAT with 6 significant digits (1234567 -> 1234570), while the binlog and the snapshot
    path carry the exact 4-byte float.
    """
    names = [
        f"CAST(`{c.name}` AS DOUBLE)" if c.data_type == "float" else f"`{c.name}`"
        for c in info.columns
    ]
    conn = server.connect(charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT {', '.join(names)} FROM {info.name} ORDER BY id")
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def test_every_type_equals_select(mariadb: LocalMariaDB, new_york_tz: None) -> None:
    """The binlog after-images, converted, equal the SELECTed rows, converted, value for value.

    Where the binlog and SELECT disagree on the raw value, the adapter/converter follows SELECT:
    BINARY(n) - the binlog drops trailing 0x00, SELECT pads to n: padded;
    CHAR - both drop trailing spaces (no PAD_CHAR_TO_FULL_LENGTH): stripped;
    FLOAT - SELECT text rounds to 6 digits; both paths keep the exact float32 (see select_rows);
    TIMESTAMP - binlog has epoch seconds, SELECT the session zone: both become the UTC instant,
    whatever TZ the process has (this test runs in America/New_York);
    zero DATE/DATETIME/TIMESTAMP - NULL (PyMySQL returns them as strings);
    YEAR 0000 - the library says 1900: 0; empty SET - the library says NULL: '';
    negative TIME with fractions - the library misdecodes them: decoded from the raw format;
    latin1 0x81 - the library's cp1252 decode fails: mapped to U+0081 like the server;
    BIT - library bit strings, SELECT bytes: both an int (BIT(64) wraps as getLong does).
    """
    fresh_database(mariadb, "cap_types", TYPES_DDL)
    start = position(mariadb)
    conn = mariadb.connect(charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SET sql_mode = '', time_zone = '+00:00'")
            for row in TYPES_ROWS:
                cur.execute(f"INSERT INTO cap_types.t VALUES {row}")
            cur.execute(TYPES_UPDATE)
    finally:
        conn.close()
    stop = position(mariadb)
    info = table_info(mariadb, "cap_types.t")
    assert len(info.columns) == 48

    last: dict[int, tuple[Any, ...]] = {}
    for change in changes(read(mariadb, start, ["cap_types.t"], stop)):
        last[change.image[0]] = change.image
    assert sorted(last) == [1, 2, 3, 4, 5]
    converter = BatchConverter(info.columns)
    from_binlog = converter.table([last[k] for k in sorted(last)])
    from_select = converter.table(select_rows(mariadb, info))
    assert from_binlog.schema == from_select.schema
    for name in from_binlog.column_names:
        assert from_binlog.column(name).to_pylist() == from_select.column(name).to_pylist(), name

    # A few values spelled out, so a shared mistake on both sides cannot hide.
    rows = {r["id"]: r for r in from_binlog.to_pylist()}
    utc = dt.UTC
    assert rows[5]["ts3"] == dt.datetime(2021, 11, 7, 5, 59, 59, 999000, tzinfo=utc)
    assert rows[5]["ts0"] == dt.datetime(2021, 3, 14, 7, 30, tzinfo=utc)
    assert rows[5]["u64"] == 18446744073709551614 and rows[5]["f"] == 16777216.0
    assert (rows[5]["d65"], rows[1]["d65"]) == ("1.25" + "0" * 28, "-" + NINES)
    assert (rows[1]["t6"], rows[3]["t1"], rows[3]["t2"]) == (
        -3_020_399_999_999,
        -100_000,
        -1_010_000,
    )
    assert (rows[2]["st"], rows[3]["st"], rows[3]["en"], rows[3]["yr"]) == ("b,a,c", "", "", 0)
    assert (rows[3]["bn"], rows[5]["bn"], rows[2]["vl"]) == (b"a\0\0\0", b"a\0\0\0", "é\x81")
    assert (rows[3]["dd"], rows[3]["dt6"], rows[3]["ts0"]) == (None, None, None)
    assert rows[3]["b64"] == -(2**63) + 1 and rows[2]["b64"] == -1
    assert all(v is None for k, v in rows[4].items() if k != "id")
    assert (rows[3]["ip6"], rows[3]["ip4"], rows[5]["ip6"]) == ("::ffff:1.2.3.4", "10.0.0.0", "1::")
    assert rows[3]["uu"] == "10000000-0000-1000-8000-000000000000"  # its trailing zeros back
