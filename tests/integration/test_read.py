"""Snapshot reads through Spark JDBC against a real MariaDB: types, chunks, errors."""

from __future__ import annotations

import datetime as dt
import logging
import struct
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, TransientReadError
from orchestrator.pipeline.read.jdbc import jdbc_properties, jdbc_url, read_chunks, required
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.types import is_boolean
from orchestrator.schema.values import staging_schema
from orchestrator.source.connection import Source
from tests.conftest import fresh_database
from tests.integration.conftest import spark_test_config

pytestmark = pytest.mark.integration

DB = "spk_read"
PASSWORD = "pa'ss\\w0rd-Sp4rk"


class Lit(str):
    """A SQL literal written into the INSERT as is (others are bound as parameters)."""


HOSTILE = [
    "it's",
    "back\\slash",
    "nul\0byte",
    "emoji 🐳",
    "new\nline\ttab",
    "'); DROP TABLE x; --",
    "trailing   ",
    "ünïcödé ㊗ עברית",
    '"double"',
]

#: (column, type, values for rows 1..n); the last row of the table is all NULL.
CASES: list[tuple[str, str, list[Any]]] = [
    ("ti", "tinyint", [-128, 127, 0]),
    ("tiu", "tinyint unsigned", [255, 0]),
    ("si", "smallint", [-32768, 32767]),
    ("siu", "smallint unsigned", [65535]),
    ("mi", "mediumint", [-8388608, 8388607]),
    ("miu", "mediumint unsigned", [16777215]),
    ("i", "int", [-2147483648, 2147483647]),
    ("iu", "int unsigned", [4294967295]),
    ("bi", "bigint", [-9223372036854775808, 9223372036854775807]),
    ("biu", "bigint unsigned", [18446744073709551615, 0, 9223372036854775808]),
    ("yr", "year", [1901, 2155, Lit("0")]),
    ("dec", "decimal(10,2)", [Decimal("-99999999.99"), Decimal("0.01"), Decimal("0")]),
    (
        "dec38",
        "decimal(38,10)",
        [Decimal("1234567890123456789012345678.0123456789"), Decimal("-0.0000000001")],
    ),
    (
        "dec50",
        "decimal(50,10)",
        [
            Decimal("-1234567890123456789012345678901234567890.0123456789"),
            Decimal("0"),
            Decimal("1.5"),
        ],
    ),
    ("fl", "float", [Lit("0.1"), Lit("1.2345678e10"), Lit("-3.4028235e38"), Lit("1.17549435e-38")]),
    ("db", "double", [0.30000000000000004, 1.7976931348623157e308, -5e-324, 1 / 3]),
    ("b1", "bit(1)", [Lit("b'1'"), Lit("b'0'")]),
    ("tb", "tinyint(1)", [1, 0, 2, -1]),
    ("b8", "bit(8)", [Lit("b'10000001'"), Lit("b'0'")]),
    ("b64", "bit(64)", [Lit("b'" + "1" * 64 + "'"), Lit("b'1'"), Lit("0x7FFFFFFFFFFFFFFF")]),
    ("ch", "char(10)", ["ab  ", "", "  x"]),
    ("vc", "varchar(100)", [*HOSTILE[:5], "trailing   "]),
    ("tx", "text", HOSTILE[4:]),
    ("en", "enum('a','b c','d''e','ü')", ["a", "b c", "d'e", "ü"]),
    ("st", "set('x','y','z')", ["x,z", "", "z,y"]),
    ("js", "json", ['{"a": [1, 2.5, null], "b": "\\u00fc"}', '"str"', "[]"]),
    ("bn", "binary(4)", [Lit("x'00'"), b"ab", b"\xff\x00\x01\x02"]),
    ("vb", "varbinary(10)", [b"\x00\xff\x10", b""]),
    ("bl", "blob", [b"\xde\xad\xbe\xef\x00", b""]),
    (
        "d",
        "date",
        [Lit("'1000-01-01'"), Lit("'9999-12-31'"), Lit("'0000-00-00'"), Lit("'2020-00-15'")],
    ),
    (
        "dt",
        "datetime(6)",
        [
            Lit("'1000-01-01 00:00:00'"),
            Lit("'9999-12-31 23:59:59.999999'"),
            Lit("'0000-00-00 00:00:00'"),
            Lit("'2021-03-28 02:30:00.5'"),
        ],
    ),
    ("dt0", "datetime", [Lit("'1969-12-31 23:59:59'"), Lit("'1582-10-10 12:00:00'")]),
    (
        "ts",
        "timestamp(6) NULL",
        [
            Lit("'1970-01-01 00:00:01.000001'"),
            Lit("'2038-01-19 03:14:07.999999'"),
            Lit("'0000-00-00 00:00:00'"),
            Lit("'2021-03-28 01:30:00'"),
        ],
    ),
    (
        "tm",
        "time(6)",
        [Lit("'-838:59:59'"), Lit("'838:59:59'"), Lit("'-00:00:00.5'"), Lit("'25:00:00.000001'")],
    ),
    ("tm0", "time", [Lit("'00:00:00'"), Lit("'-01:02:03'")]),
    ("we`ird col ü", "varchar(10)", ["x"]),
]
ROWS = max(len(values) for _, _, values in CASES) + 1

#: Values stated independently of any client library: (column, row id) -> value.
EXPLICIT: dict[tuple[str, int], Any] = {
    ("tm", 1): -3020399000000,
    ("tm", 3): -500000,
    ("tm", 4): 90000000001,
    ("tm0", 2): -3723000000,
    ("b64", 1): -1,
    ("b64", 3): 9223372036854775807,
    ("b8", 1): 129,
    ("biu", 1): Decimal(18446744073709551615),
    ("yr", 3): 0,
    ("d", 1): dt.date(1000, 1, 1),
    ("d", 3): None,
    ("d", 4): None,
    ("dt", 2): dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    ("dt", 3): None,
    ("dt", 4): dt.datetime(2021, 3, 28, 2, 30, 0, 500000),
    ("dt0", 2): dt.datetime(1582, 10, 10, 12),
    ("ts", 1): dt.datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=dt.UTC),
    ("ts", 3): None,
    ("fl", 2): 12345677824.0,
    ("db", 4): 1 / 3,
    ("db", 3): -5e-324,
    ("ch", 1): "ab",
    ("ch", 3): "  x",
    ("bn", 2): b"ab\0\0",
    ("bn", 1): b"\0\0\0\0",
    ("tb", 3): True,
    ("tb", 4): True,
    ("b1", 2): False,
    ("vc", 3): "nul\0byte",
    ("vc", 6): "trailing   ",
    ("dec50", 2): "0.0000000000",
    ("dec50", 3): "1.5000000000",
}


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _config(
    tmp_path: Path,
    server: LocalMariaDB,
    user: str = "spk_reader",
    password: str = PASSWORD,
    port: int | None = None,
) -> PipelineConfig:
    source = {**server.source_config(user=user, password=password), "connect_timeout": 3}
    if port is not None:
        source["port"] = port
    return spark_test_config(tmp_path, source=source)


@pytest.fixture(scope="module")
def reader(mariadb: LocalMariaDB) -> LocalMariaDB:
    """The server, with a SELECT-only user ``spk_reader`` whose password is hostile."""
    create_reader(mariadb)
    return mariadb


@pytest.fixture(scope="module")
def types_table(reader: LocalMariaDB) -> TableInfo:
    return create_types_table(reader)


def create_reader(mariadb: LocalMariaDB) -> None:
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:  # bound: the password holds a quote and a backslash
            cur.execute("CREATE USER IF NOT EXISTS 'spk_reader'@'%%' IDENTIFIED BY %s", (PASSWORD,))
            cur.execute("GRANT SELECT ON *.* TO 'spk_reader'@'%'")
    finally:
        conn.close()


def create_types_table(mariadb: LocalMariaDB) -> TableInfo:
    """``spk_read.types``: a column per CASES entry, a row per value, a last row of NULLs."""
    columns = ", ".join(f"{q(name)} {ctype}" for name, ctype, _ in CASES)
    fresh_database(
        mariadb,
        DB,
        f"CREATE TABLE {DB}.types (id int PRIMARY KEY, {columns}) DEFAULT CHARSET=utf8mb4",
    )
    conn = mariadb.connect(database=DB, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            for row in range(1, ROWS + 1):
                names, marks, params = ["id"], ["%s"], [row]
                for name, _, values in CASES:
                    if row <= len(values):
                        value = values[row - 1]
                        names.append(q(name))
                        marks.append(str(value) if isinstance(value, Lit) else "%s")
                        if not isinstance(value, Lit):
                            params.append(value)
                cur.execute(
                    f"INSERT INTO types ({', '.join(names)}) VALUES ({', '.join(marks)})", params
                )
    finally:
        conn.close()
    config = _config(Path("/tmp"), mariadb, user="root", password="")
    with Source.from_pipeline(config) as source:
        return source.table_info(f"{DB}.types")


def expected_value(column: ColumnInfo, value: Any) -> Any:
    """What a PyMySQL SELECT value becomes in staging (docs/types.md mapping), test-side."""
    if value is None:
        return None
    t = column.data_type
    if is_boolean(column):
        return bool(int.from_bytes(value, "big")) if isinstance(value, bytes) else bool(value)
    if t == "bit":
        number = int.from_bytes(value, "big")
        return number - (1 << 64) if number >= 1 << 63 else number
    if t == "bigint" and column.unsigned:
        return Decimal(value)
    if t == "decimal" and (column.precision or 0) > 38:
        return f"{value:.{column.scale}f}"
    if t == "float":
        return struct.unpack("<f", struct.pack("<f", value))[0]
    if t == "date":
        return value if isinstance(value, dt.date) else None
    if t == "datetime":
        return value if isinstance(value, dt.datetime) else None
    if t == "timestamp":
        return value.replace(tzinfo=dt.UTC) if isinstance(value, dt.datetime) else None
    if t == "time":
        return value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds
    return value


def select_expected(server: LocalMariaDB, table: TableInfo) -> dict[int, dict[str, Any]]:
    # FLOAT through the text protocol prints 6 digits; widened to DOUBLE it is the stored value.
    exprs = [
        f"CAST({q(c.name)} AS DOUBLE)" if c.data_type == "float" else q(c.name)
        for c in table.columns
    ]
    conn = server.connect(database=DB, charset="utf8mb4")
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT {', '.join(exprs)} FROM {q(table.table)} ORDER BY id")
            rows = cur.fetchall()
    finally:
        conn.close()
    return {
        row[0]: {c.name: expected_value(c, v) for c, v in zip(table.columns, row, strict=True)}
        for row in rows
    }


def test_every_type_reads_as_staging_type_and_value(
    spark: Any, mariadb: LocalMariaDB, types_table: TableInfo, tmp_path: Path
) -> None:
    """Each chunk's file is a data file: published types and values, sorted by key, the field IDs
    of the (new) Iceberg table, NOT NULL columns required."""
    config = _config(tmp_path, mariadb)
    dirs = {0: str(tmp_path / "chunk-000000"), 1: str(tmp_path / "chunk-000001")}
    result = read_chunks(
        spark, config, types_table, [(0, "`id` < 3"), (1, "`id` >= 3")], dirs.__getitem__, ("id",)
    )
    assert result[0][0] == 2 and result[1][0] == ROWS - 2

    want = staging_schema(types_table.columns)
    got_rows: dict[int, dict[str, Any]] = {}
    for directory in dirs.values():
        (file,) = Path(directory).iterdir()
        schema = pq.read_schema(file)
        assert schema.names == want.names
        assert [f.type for f in schema] == [f.type for f in want]
        assert [f.nullable for f in schema] == [f.nullable for f in want]
        assert [f.metadata[b"PARQUET:field_id"] for f in schema] == [
            str(i).encode() for i in range(1, len(want) + 1)
        ]
        table = pq.read_table(file)
        assert table.column("id").to_pylist() == sorted(table.column("id").to_pylist())
        got_rows.update({r["id"]: r for r in table.to_pylist()})

    expected = select_expected(mariadb, types_table)
    assert sorted(got_rows) == sorted(expected) == list(range(1, ROWS + 1))
    for row_id, row in expected.items():
        for name, value in row.items():
            assert got_rows[row_id][name] == value, (name, row_id)
    for (name, row_id), value in EXPLICIT.items():
        assert got_rows[row_id][name] == value, (name, row_id)
    assert all(v is None for k, v in got_rows[ROWS].items() if k != "id")


@pytest.mark.usefixtures("reader")
def test_batch_writes_each_chunk_to_its_own_dir(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    mariadb.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    mariadb.execute(
        "DROP TABLE IF EXISTS many",
        "CREATE TABLE many (id int PRIMARY KEY, v varchar(20))",
        "INSERT INTO many SELECT seq, CONCAT('v', seq) FROM seq_1_to_1000",
        database=DB,
    )
    config = _config(tmp_path, mariadb)
    with Source.from_pipeline(_config(tmp_path, mariadb, "root", "")) as source:
        info = source.table_info(f"{DB}.many")
    chunks = [
        (10, "`id` >= 1 AND `id` < 100"),
        (11, "`id` >= 100 AND `id` < 400"),
        (12, "`id` >= 400 AND `id` < 400"),
        (13, "`id` >= 400"),
    ]
    out = tmp_path / "snapshot" / f"{DB}.many"
    stale = out / "chunk-000011-0ld" / "part-00007.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by a failed attempt")

    for attempt in ("a1", "b2"):  # each attempt writes dirs of its own; none is replaced
        result = read_chunks(
            spark,
            config,
            info,
            chunks,
            lambda i, a=attempt: str(out / f"chunk-{i:06d}-{a}"),
            ("id",),
        )
        assert {i: rows for i, (rows, _) in result.items()} == {10: 99, 11: 300, 12: 0, 13: 601}
        assert all(nbytes > 0 for _, nbytes in result.values())
        for index, low, high in [(10, 1, 100), (11, 100, 400), (12, 400, 400), (13, 400, 1001)]:
            table = ds.dataset(
                str(out / f"chunk-{index:06d}-{attempt}"), format="parquet"
            ).to_table()
            assert table.column("id").to_pylist() == list(range(low, high)), "sorted by key"
            assert table.schema.names == ["id", "v"]
    assert stale.read_bytes() == b"left by a failed attempt"  # another attempt's: never touched
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["chunk-000011-0ld"]
        + [f"chunk-0000{i}-{a}" for i in (10, 11, 12, 13) for a in ("a1", "b2")]
    )


@pytest.mark.usefixtures("reader")
@pytest.mark.parametrize("kind", ["plain", "partitioned", "myisam"])
def test_rows_returned_out_of_key_order_are_sorted(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """An InnoDB table's integer key's chunk is written as the server returns it, then checked:
    a partitioned table returns its partitions one after the other, so its job runs again with
    Spark's sort. A MyISAM table, which scans in storage order, is sorted at once."""
    table = f"parts_{kind}"
    mariadb.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    mariadb.execute(
        f"DROP TABLE IF EXISTS {table}",
        f"CREATE TABLE {table} (id int PRIMARY KEY, v varchar(20))"
        + {
            "plain": "",
            "partitioned": " PARTITION BY HASH(id) PARTITIONS 4",
            "myisam": " ENGINE=MyISAM",
        }[kind],
        # stored newest key first: a MyISAM scan returns them so
        f"INSERT INTO {table} SELECT seq, CONCAT('v', seq) FROM seq_1000_to_1",
        database=DB,
    )
    with Source.from_pipeline(_config(tmp_path, mariadb, "root", "")) as source:
        info = source.table_info(f"{DB}.{table}")
        returned = [r[0] for r in source.query(f"SELECT id, v FROM {DB}.{table} WHERE 1 = 1")]
    assert (returned != sorted(returned)) == (kind != "plain")  # what the test is about
    out = tmp_path / "snapshot"
    with caplog.at_level(logging.INFO, logger="orchestrator.pipeline.read.jdbc"):
        # a whole table in one chunk (a scan: partitioned, it returns one partition after another)
        # and a key range (read along the key, in order, partitioned or not)
        result = read_chunks(
            spark,
            _config(tmp_path, mariadb),
            info,
            [(0, "1 = 1"), (1, "`id` >= 400")],
            lambda i: str(out / f"c{i}"),
            ("id",),
        )
    assert {i: rows for i, (rows, _) in result.items()} == {0: 1000, 1: 601}
    for index, low, high in [(0, 1, 1001), (1, 400, 1001)]:
        got = ds.dataset(str(out / f"c{index}"), format="parquet").to_table()
        assert got.column("id").to_pylist() == list(range(low, high)), "in key order"
        assert got.column("v").to_pylist() == [f"v{i}" for i in range(low, high)]
    assert ("returned rows out of key order" in caplog.text) == (kind == "partitioned")


@pytest.mark.usefixtures("reader")
def test_predicates_use_raw_columns_and_index(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Chunk predicates and the table filter compare the raw DATETIME / string key columns."""
    mariadb.execute(
        f"CREATE DATABASE IF NOT EXISTS {DB}",
        f"DROP TABLE IF EXISTS {DB}.comp",
        f"CREATE TABLE {DB}.comp (name varchar(20), n int, created datetime, "
        "PRIMARY KEY (name, n)) DEFAULT CHARSET=utf8mb4",
        f"INSERT INTO {DB}.comp VALUES ('a', 1, '2020-01-01'), ('a', 2, '2020-01-03'), "
        "('it''s', 1, '2020-01-05'), ('ü', 1, '2020-01-02'), ('z', 9, '2019-12-31')",
    )
    with Source.from_pipeline(_config(tmp_path, mariadb, "root", "")) as source:
        info = source.table_info(f"{DB}.comp")
    where = "(created >= '2020-01-01')"
    chunks = [
        (0, f"((`name` < 'it''s') OR (`name` = 'it''s' AND `n` < 1)) AND {where}"),
        (1, f"((`name` > 'it''s') OR (`name` = 'it''s' AND `n` >= 1)) AND {where}"),
    ]
    result = read_chunks(
        spark,
        _config(tmp_path, mariadb),
        info,
        chunks,
        lambda i: str(tmp_path / f"c{i}"),
        ("name", "n"),
    )
    assert result[0][0] == 2 and result[1][0] == 2
    first = ds.dataset(str(tmp_path / "c1"), format="parquet").to_table().to_pylist()
    assert [(r["name"], r["n"]) for r in first] == [("it's", 1), ("ü", 1)]


@pytest.mark.usefixtures("reader")
def test_chunk_reads_run_in_the_session_tidemark_sets(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """Spark's read with predicates dropped connection properties named in camel case: the
    chunks were read without ``sessionVariables`` (time zone, sql_mode) and as text."""
    config = _config(tmp_path, mariadb)
    info = TableInfo(DB, "many", (ColumnInfo("id", "int", "int(11)", False),), ("id",), (), 0)
    session = (
        "@@SESSION.sql_mode = 'ALLOW_INVALID_DATES' AND @@SESSION.time_zone = '+00:00' "
        "AND @@SESSION.net_write_timeout = 600"
    )
    counted = read_chunks(
        spark, config, info, [(0, "TRUE"), (1, session)], lambda i: str(tmp_path / f"s{i}"), ("id",)
    )
    assert counted[1][0] == counted[0][0] > 0


@pytest.mark.usefixtures("reader")
def test_credentials_stay_out_of_url_and_errors(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    config = _config(tmp_path, mariadb)
    url = jdbc_url(config, "org.mariadb.jdbc.Driver")
    assert PASSWORD not in url and "password" not in url.lower()
    props = jdbc_properties(config, "org.mariadb.jdbc.Driver")
    assert props["password"] == PASSWORD and int(props["fetchsize"]) > 0
    info = TableInfo(DB, "many", (ColumnInfo("id", "int", "int(11)", False),), ("id",), (), 0)

    with pytest.raises(RunFailed) as bad_sql:
        read_chunks(
            spark, config, info, [(0, "no_such_column = 1")], lambda i: str(tmp_path / "x"), ("id",)
        )
    assert f"{DB}.many" in str(bad_sql.value) and "no_such_column" in str(bad_sql.value)
    assert not isinstance(bad_sql.value, TransientReadError)

    refused = _config(tmp_path, mariadb, port=1)
    with pytest.raises(RunFailed) as lost:
        read_chunks(spark, refused, info, [(0, "1 = 1")], lambda i: str(tmp_path / "x"), ("id",))
    assert isinstance(lost.value, TransientReadError)

    wrong = _config(tmp_path, mariadb, password=PASSWORD + "-nope")
    with pytest.raises(RunFailed) as denied:
        read_chunks(spark, wrong, info, [(0, "1 = 1")], lambda i: str(tmp_path / "x"), ("id",))
    assert "Access denied" in str(denied.value)
    for error in (bad_sql.value, lost.value, denied.value):
        assert PASSWORD not in str(error) and PASSWORD not in repr(error.args)
        assert error.__cause__ is None and error.__suppress_context__
    assert not (tmp_path / "x").exists()


@pytest.mark.usefixtures("reader")
def test_connection_killed_mid_read_is_retried_by_spark(
    spark: Any, mariadb: LocalMariaDB, tmp_path: Path
) -> None:
    """A chunk whose connection dies mid-read is read again by a task retry (local[N,F])."""
    mariadb.execute(f"CREATE DATABASE IF NOT EXISTS {DB}")
    mariadb.execute(
        "DROP TABLE IF EXISTS slow",
        "CREATE TABLE slow (id int PRIMARY KEY)",
        "INSERT INTO slow SELECT seq FROM seq_1_to_20",
        database=DB,
    )
    with Source.from_pipeline(_config(tmp_path, mariadb, "root", "")) as source:
        info = source.table_info(f"{DB}.slow")
    killed: list[int] = []

    def kill_first_reader() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not killed:
            for pid, user, info_text in mariadb.execute(
                "SELECT id, user, info FROM information_schema.processlist"
            ):
                if user == "spk_reader" and info_text and "SLEEP(0.1)" in info_text:
                    mariadb.execute(f"KILL {pid}")
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_reader)
    killer.start()
    try:
        result = read_chunks(
            spark,
            _config(tmp_path, mariadb),
            info,
            [(0, "`id` <= 20 AND SLEEP(0.1) = 0")],
            lambda i: str(tmp_path / "c0"),
            ("id",),
        )
    finally:
        killer.join()
    assert killed, "the read finished before it could be interrupted"
    assert result[0][0] == 20
    ids = ds.dataset(str(tmp_path / "c0"), format="parquet").to_table().column("id").to_pylist()
    assert sorted(ids) == list(range(1, 21))


def test_a_null_in_a_required_column_fails_the_job(spark: Any) -> None:
    """A NOT NULL column is non-nullable to Spark (a required Parquet field, as Iceberg wants),
    and a NULL reaching it fails the job naming the column rather than being written."""
    df = spark.createDataFrame([(1,), (None,)], "v int")
    out = df.select(
        required(F.col("v"), T.IntegerType(), "table t: NULL read from NOT NULL column v").alias(
            "v"
        )
    )
    assert not out.schema["v"].nullable
    with pytest.raises(Exception, match="NULL read from NOT NULL column v"):
        out.collect()
