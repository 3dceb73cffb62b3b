"""Chunk planning against a real MariaDB: literals, exact partitions, index cost, `tidemark plan`.

The partition property, for every generated key set: the chunks' predicates
count to the table's row count, every row is matched by exactly one chunk,
and chunk sizes stay near the target (uneven: exactly ``chunk_size`` but the
last, which is within [0.5, 1.5] x; even: at most ``ceil(factor x chunk_size)``,
so within 2x whenever the factor is at most 2, and exact on dense keys).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from chunking import TablePlan, chunk_predicate, decode_key, sql_literal
from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import Defaults, SourceConfig, TableConfig
from orchestrator.errors import SourceNotReady
from orchestrator.pipeline.plan.chunks import check_escaping, plan_table
from orchestrator.source.connection import Source
from tests.conftest import fresh_database, pipeline_config, write_config

pytestmark = pytest.mark.integration

DB = "chunk_plan"
TIDEMARK = str(Path(sys.executable).with_name("tidemark"))
MAX_TIME = timedelta(hours=838, minutes=59, seconds=59)
EXAMPLES = int(os.environ.get("TIDEMARK_PLANNING_EXAMPLES", "15"))  # raise it for a longer hunt
DB_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def server(mariadb: LocalMariaDB) -> LocalMariaDB:
    fresh_database(mariadb, DB)
    return mariadb


@pytest.fixture(scope="module")
def source(server: LocalMariaDB) -> Iterator[Source]:
    config = SourceConfig(host="127.0.0.1", port=server.port, user="root", server_id=54001)
    with Source(config, "") as src:
        yield src


@pytest.fixture(scope="module")
def conn(server: LocalMariaDB) -> Iterator[pymysql.connections.Connection[Any]]:
    connection = server.connect(charset="utf8mb4", init_command="SET time_zone = '+00:00'")
    yield connection
    connection.close()


def run(
    conn: pymysql.connections.Connection[Any], sql: str, args: Any = None
) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def build(
    conn: pymysql.connections.Connection[Any],
    name: str,
    ddl: str,
    rows: Sequence[tuple[Any, ...]],
    *,
    ignore: bool = False,
) -> str:
    """(Re)create ``DB.name`` and load ``rows`` through PyMySQL's own escaping (not ours)."""
    table = f"{DB}.{name}"
    run(conn, f"DROP TABLE IF EXISTS {table}")
    run(conn, f"CREATE TABLE {table} ({ddl}) ENGINE=InnoDB")
    if rows:
        marks = ", ".join(["%s"] * len(rows[0]))
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT {'IGNORE ' if ignore else ''}INTO {table} VALUES ({marks})", list(rows)
            )
    run(conn, f"ANALYZE TABLE {table}")  # a settled row estimate, as a table in service has
    return table


def plan(source: Source, table: str, chunk_size: int, **config: Any) -> TablePlan:
    table_config = TableConfig(table, chunk_size=chunk_size, batch_chunks=4, **config)
    return plan_table(source.query, table_config, source.table_info(table), Defaults())


def verify_partition(source: Source, result: TablePlan, chunk_size: int) -> list[int]:
    """Assert the plan partitions the table exactly and is balanced; return the chunk sizes."""
    table = result.table
    info = source.table_info(table)
    total = source.query(f"SELECT COUNT(*) FROM {table}")[0][0]
    if not result.chunks:
        assert total == 0 and result.strategy == "empty"
        return []
    preds = [chunk_predicate(result.chunk_key, c.range, info.columns) for c in result.chunks]
    union = " UNION ALL ".join(
        f"SELECT {i}, COUNT(*) FROM {table} WHERE {p}" for i, p in enumerate(preds)
    )
    counts = [int(n) for _, n in sorted(source.query(union))]
    assert sum(counts) == total
    hits = " + ".join(f"({p})" for p in preds)
    assert source.query(f"SELECT COUNT(*) FROM {table} WHERE ({hits}) <> 1")[0][0] == 0
    first, last = result.chunks[0].range, result.chunks[-1].range
    assert first.start is None and last.end_inclusive
    assert last.end == decode_key(result.stats["max"])
    top = source.query(
        f"SELECT {', '.join(result.chunk_key)} FROM {table} WHERE {preds[-1]} "
        f"ORDER BY {' DESC, '.join(result.chunk_key)} DESC LIMIT 1"
    )
    assert top and tuple(top[0]) == last.end
    for a, b in zip(result.chunks, result.chunks[1:], strict=False):
        assert a.range.end == b.range.start and not a.range.end_inclusive
    assert_balanced(result, counts, chunk_size)
    if currently_in_test_context():  # --hypothesis-show-statistics shows what the examples covered
        event(
            f"{result.strategy}, "
            f"{'1' if len(counts) == 1 else '2-9' if len(counts) < 10 else '10+'} chunks"
        )
    return counts


def assert_balanced(result: TablePlan, counts: list[int], chunk_size: int) -> None:
    if result.strategy == "uneven":
        assert all(n == chunk_size for n in counts[:-1])
        assert counts[-1] <= 1.5 * chunk_size
        assert len(counts) == 1 or counts[-1] >= chunk_size / 2
        assert [c.estimated_rows for c in result.chunks] == counts
    else:
        factor = result.stats["factor"]
        assert max(counts) <= math.ceil(factor * chunk_size)  # a stride holds at most its width
        if factor <= 2:
            assert max(counts) <= 2 * chunk_size
        if factor == 1 and len(counts) > 1:
            assert min(counts) >= chunk_size / 2


# --------------------------------------------------------------------------- literals

HOSTILE: list[tuple[str, Any]] = [
    ("VARCHAR(200) COLLATE utf8mb4_bin", "O'Brien \"quoted\" back\\slash \\' %_ ;--"),
    ("VARCHAR(200) COLLATE utf8mb4_bin", "nul\0 newline\n return\r ctrl-z\x1a tab\t"),
    ("VARCHAR(200) COLLATE utf8mb4_bin", "emoji 😀🏳️‍🌈 ünïcödé ß ǅ ﬃ"),
    ("VARCHAR(200) COLLATE utf8mb4_bin", "trailing backslash \\"),
    ("MEDIUMTEXT", "long 'x' \\ " * 20_000),
    ("BIGINT UNSIGNED", 18446744073709551615),
    ("BIGINT", -9223372036854775808),
    ("INT", -1),
    (
        "DECIMAL(65, 30)",
        Decimal("-12345678901234567890123456789012345.123456789012345678901234567890"),
    ),
    ("DECIMAL(10, 0)", Decimal("1E+5")),
    ("DOUBLE", -2.5e-300),
    ("VARBINARY(20)", b"\x00\x01'\"\\\xff\n"),
    ("VARBINARY(20)", b""),
    ("BINARY(4)", b"ab\x00\x00"),
    ("DATETIME(6)", datetime(2024, 2, 29, 23, 59, 59, 999999)),
    ("DATETIME(6)", datetime(1000, 1, 1, 0, 0, 0, 1)),
    ("TIMESTAMP(6)", datetime(2038, 1, 19, 3, 14, 7, 999999)),
    ("DATE", date(9999, 12, 31)),
    ("TIME(6)", -MAX_TIME),
    ("TIME(6)", timedelta(hours=25, microseconds=1)),
    ("TIME(6)", -timedelta(microseconds=500000)),
]


@pytest.mark.parametrize(
    ("column_type", "value"),
    HOSTILE,
    ids=[f"{i}-{t.split()[0]}" for i, (t, _) in enumerate(HOSTILE)],
)
def test_literal_round_trips_through_mariadb(conn: Any, column_type: str, value: Any) -> None:
    literal = sql_literal(value)
    selected = run(conn, f"SELECT {literal}")[0][0]
    if isinstance(value, str | bytes):
        assert selected == value
    else:  # typed literals come back typed; compare after the column's own conversion below
        assert selected == value or str(selected) == str(value)
    table = build(conn, "literal", f"id INT PRIMARY KEY, v {column_type}", [(1, value), (2, None)])
    if isinstance(value, str):
        run(conn, f"INSERT INTO {table} VALUES (3, %s)", (value[:-1] + "?",))  # a near miss
    found = run(conn, f"SELECT id, v FROM {table} WHERE v = {literal}")
    assert found == [(1, value)]


def test_string_literals_follow_the_column_collation(conn: Any) -> None:
    table = build(
        conn,
        "collated",
        "k VARCHAR(10) COLLATE utf8mb4_general_ci PRIMARY KEY",
        [("a",), ("é",), ("ß",)],
    )
    assert run(conn, f"SELECT k FROM {table} WHERE k = {sql_literal('A ')}") == [("a",)]
    assert run(conn, f"SELECT k FROM {table} WHERE k = {sql_literal('E')}") == [("é",)]
    assert run(conn, f"SELECT COUNT(*) FROM {table} WHERE k >= {sql_literal('B')}")[0][0] == 2


def test_char_keys_with_no_pad_collations_really_misbehave(conn: Any) -> None:
    """Why they are refused: the index and the expression disagree on where '\x1a' sorts."""
    table = build(
        conn,
        "nopad",
        "k CHAR(4) COLLATE utf8mb4_nopad_bin NOT NULL PRIMARY KEY",
        [("",), ("\x1a",)],
    )
    by_index = run(conn, f"SELECT COUNT(*) FROM {table} FORCE INDEX (PRIMARY) WHERE k >= ''")[0][0]
    by_scan = run(conn, f"SELECT COUNT(*) FROM {table} IGNORE INDEX (PRIMARY) WHERE k >= ''")[0][0]
    assert (by_index, by_scan) == (1, 2)


def test_no_backslash_escapes_is_refused(server: LocalMariaDB) -> None:
    other = server.connect()
    try:
        run(other, "SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'")
        with pytest.raises(SourceNotReady, match="NO_BACKSLASH_ESCAPES"):
            check_escaping(lambda sql: run(other, sql))
    finally:
        other.close()


# --------------------------------------------------------------------------- partitions


def sized(elements: st.SearchStrategy[Any], data: st.DataObject, most: int) -> list[Any]:
    """A list of a drawn size (Hypothesis alone favours short lists, which make one-chunk plans)."""
    size = data.draw(st.integers(0, most), label="size")
    return data.draw(st.lists(elements, min_size=size, max_size=size))


def chunk_size_for(data: st.DataObject, rows: int) -> int:
    """A target giving between about 2 and 60 chunks for ``rows`` rows (1 and up for tiny
    tables)."""
    return data.draw(st.integers(max(1, rows // 60), max(1, rows // 2)), label="chunk_size")


@DB_SETTINGS
@given(
    start=st.integers(min_value=-(2**63), max_value=2**63 - 2000),
    n=st.integers(0, 1200),
    chunk_size=st.integers(5, 250),
)
def test_dense_keys(conn: Any, source: Source, start: int, n: int, chunk_size: int) -> None:
    table = build(
        conn, "dense", "k BIGINT NOT NULL PRIMARY KEY, v INT", [(start + i, i) for i in range(n)]
    )
    result = plan(source, table, chunk_size)
    assert result.strategy == ("even" if n else "empty")
    assert result.stats["queries"] == (2 if n else 1)  # no query per chunk
    verify_partition(source, result, chunk_size)


@DB_SETTINGS
@given(data=st.data(), low=st.integers(0, 1000))
def test_sparse_keys(conn: Any, source: Source, data: st.DataObject, low: int) -> None:
    high = set(sized(st.integers(0, 10**9), data, 400))
    keys = [*range(1, low + 1), *(10**12 + h for h in sorted(high))]
    chunk_size = chunk_size_for(data, len(keys))
    table = build(conn, "sparse", "k BIGINT NOT NULL PRIMARY KEY", [(k,) for k in keys])
    result = plan(source, table, chunk_size)
    if low and high:
        assert result.strategy == "uneven"
    verify_partition(source, result, chunk_size)


@DB_SETTINGS
@given(data=st.data(), spread=st.sampled_from([0, 10**6, 2**64 - 1]))
def test_unsigned_keys_near_two_to_the_64(
    conn: Any, source: Source, data: st.DataObject, spread: int
) -> None:
    if spread:
        offsets = set(sized(st.integers(0, spread), data, 800))
    else:  # dense up to the very top
        offsets = set(range(data.draw(st.integers(0, 1500))))
    rows = [(2**64 - 1 - o,) for o in sorted(offsets)]
    chunk_size = chunk_size_for(data, len(rows))
    table = build(conn, "unsigned", "k BIGINT UNSIGNED NOT NULL PRIMARY KEY", rows)
    verify_partition(source, plan(source, table, chunk_size), chunk_size)


INT_TYPES = [
    ("TINYINT UNSIGNED", 0, 255),
    ("SMALLINT", -32768, 32767),
    ("MEDIUMINT", -8388608, 8388607),
    ("INT UNSIGNED", 0, 2**32 - 1),
    ("YEAR", 1901, 2155),
]


@DB_SETTINGS
@given(data=st.data(), kind=st.sampled_from(INT_TYPES))
def test_integer_subsets(
    conn: Any, source: Source, data: st.DataObject, kind: tuple[str, int, int]
) -> None:
    column_type, lo, hi = kind
    origin = data.draw(st.integers(lo, hi))
    width = data.draw(st.integers(0, min(hi - origin, 30_000)))
    keys = set(sized(st.integers(origin, origin + width), data, 1000))
    chunk_size = chunk_size_for(data, len(keys))
    table = build(
        conn, "ints", f"k {column_type} NOT NULL PRIMARY KEY", [(k,) for k in sorted(keys)]
    )
    verify_partition(source, plan(source, table, chunk_size), chunk_size)


def test_a_year_key_holding_0000_is_walked(conn: Any, source: Source) -> None:
    """An even split's strides from 0000 gave bounds below 100, which MySQL reads as two-digit
    years (50 is 2050): with a raised distribution factor the chunks missed rows."""
    table = build(
        conn, "years", "k YEAR NOT NULL PRIMARY KEY", [(0,)] + [(y,) for y in range(1901, 2156)]
    )
    defaults = Defaults(even_distribution_factor=(0.05, 1000.0))
    result = plan_table(
        source.query,
        TableConfig(table, chunk_size=5, batch_chunks=4),
        source.table_info(table),
        defaults,
    )
    assert result.strategy == "uneven"
    verify_partition(source, result, 5)


ALPHABET = "aAbBzZeEéÉèßs ' \" \\ % _ \0\n\r\t\x1a 😀😁äöü ǅﬃ 0 9 "
COLLATIONS = [
    "utf8mb4_general_ci",
    "utf8mb4_unicode_ci",
    "utf8mb4_bin",
    "utf8mb4_unicode_520_nopad_ci",
    "utf8mb4_nopad_bin",
]


@DB_SETTINGS
@given(
    data=st.data(),
    collation=st.sampled_from(COLLATIONS),
    column=st.sampled_from(["VARCHAR(20)", "CHAR(12)"]),
)
def test_text_keys_in_their_collation(
    conn: Any, source: Source, data: st.DataObject, collation: str, column: str
) -> None:
    # the collation decides which keys are duplicates ('a' = 'A ' in general_ci): INSERT IGNORE
    # keeps one
    keys = sized(st.text(ALPHABET, max_size=8), data, 500)
    ddl = f"k {column} CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL PRIMARY KEY"
    table = build(conn, "texts", ddl, [(k,) for k in keys], ignore=True)
    chunk_size = chunk_size_for(data, source.query(f"SELECT COUNT(*) FROM {table}")[0][0])
    if column.startswith("CHAR") and "nopad" in collation:
        # MariaDB orders such an index by padded values but compares unpadded ones: refused
        with pytest.raises(SourceNotReady, match="NO PAD"):
            plan(source, table, chunk_size)
        return
    result = plan(source, table, chunk_size)
    assert result.strategy in ("uneven", "empty")
    verify_partition(source, result, chunk_size)


SKEWED = st.sampled_from([1, 1, 1, 1, 1, 1, 1, 2, 3, -7, 2**31 - 1])


def check_loaded(
    conn: Any, source: Source, data: st.DataObject, name: str, ddl: str, rows: list[tuple[Any, ...]]
) -> TablePlan:
    table = build(conn, name, ddl, rows, ignore=True)  # the database drops what it deems duplicates
    chunk_size = chunk_size_for(data, source.query(f"SELECT COUNT(*) FROM {table}")[0][0])
    result = plan(source, table, chunk_size)
    verify_partition(source, result, chunk_size)
    return result


@DB_SETTINGS
@given(data=st.data())
def test_skewed_composite_keys(conn: Any, source: Source, data: st.DataObject) -> None:
    rows = sized(st.tuples(SKEWED, st.text("aAbBéE'\\% 😀", max_size=5)), data, 800)
    ddl = "a INT NOT NULL, b VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL, PRIMARY KEY (a, b)"
    check_loaded(conn, source, data, "skewed", ddl, rows)


@DB_SETTINGS
@given(data=st.data())
def test_three_column_keys(conn: Any, source: Source, data: st.DataObject) -> None:
    rows = sized(
        st.tuples(
            st.dates(date(2020, 1, 1), date(2020, 1, 3)), st.integers(-3, 3), st.binary(max_size=3)
        ),
        data,
        600,
    )
    ddl = "d DATE NOT NULL, n SMALLINT NOT NULL, b VARBINARY(4) NOT NULL, PRIMARY KEY (d, n, b)"
    check_loaded(conn, source, data, "triple", ddl, rows)


TEMPORAL = [
    ("DATETIME(6)", st.datetimes(datetime(1000, 1, 1), datetime(9999, 12, 31, 23, 59, 59))),
    (
        "DATETIME(6)",
        st.datetimes(datetime(2024, 1, 1), datetime(2024, 1, 1, 0, 0, 1)),
    ),  # microseconds apart
    ("DATE", st.dates(date(1000, 1, 1), date(9999, 12, 31))),
    ("TIME(6)", st.timedeltas(-MAX_TIME, MAX_TIME)),
    ("TIMESTAMP(6)", st.datetimes(datetime(1970, 1, 2), datetime(2038, 1, 18))),
    ("DECIMAL(30, 6)", st.decimals(-(10**23), 10**23, places=6)),
    ("DOUBLE", st.floats(allow_nan=False, allow_infinity=False)),
    ("VARBINARY(8)", st.binary(max_size=6)),
    ("BINARY(4)", st.binary(max_size=4)),
]


@DB_SETTINGS
@given(data=st.data(), kind=st.sampled_from(TEMPORAL))
def test_temporal_decimal_float_binary_keys(
    conn: Any, source: Source, data: st.DataObject, kind: tuple[str, Any]
) -> None:
    column_type, values = kind
    keys = sized(values, data, 600)
    result = check_loaded(
        conn, source, data, "typed", f"k {column_type} NOT NULL PRIMARY KEY", [(k,) for k in keys]
    )
    assert result.strategy in ("uneven", "empty")


# --------------------------------------------------------------------------- behaviour


def test_rows_after_planning(conn: Any, source: Source) -> None:
    table = build(conn, "later", "k INT NOT NULL PRIMARY KEY", [(k,) for k in range(100, 600, 3)])
    result = plan(source, table, 20)
    run(
        conn, f"INSERT INTO {table} VALUES (5), (101), (599), (100000)"
    )  # below min, gap, above max
    info = source.table_info(table)
    preds = [chunk_predicate(result.chunk_key, c.range, info.columns) for c in result.chunks]
    keys = Counter(k for p in preds for (k,) in source.query(f"SELECT k FROM {table} WHERE {p}"))
    assert keys[5] == 1 and keys[101] == 1  # rows below the max are in exactly one chunk
    assert keys[599] == 0 and keys[100000] == 0  # rows above it are the binlog's
    assert max(keys.values()) == 1


def test_decision_is_logged_with_numbers(
    conn: Any, source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    table = build(conn, "logged", "k BIGINT NOT NULL PRIMARY KEY", [(k,) for k in range(1, 901)])
    with caplog.at_level(logging.INFO, logger="tidemark.planning"):
        plan(source, table, 100)
    assert (
        f"table {table}: strategy even, min 1, max 900, rows 900, distribution factor 1, 9 chunks, "
        "2 queries"
    ) in caplog.text


def test_where_filter_is_anded_in(conn: Any, source: Source) -> None:
    table = build(
        conn, "filtered", "k INT NOT NULL PRIMARY KEY, v INT", [(k, k % 3) for k in range(1, 301)]
    )
    where = "v = 0 OR v = 1"  # an OR: without its parentheses it would leak into every chunk
    result = plan(source, table, 40, where=where)
    info = source.table_info(table)
    total = sum(
        source.query(
            f"SELECT COUNT(*) FROM {table} WHERE "
            f"{chunk_predicate(result.chunk_key, c.range, info.columns, where)}"
        )[0][0]
        for c in result.chunks
    )
    assert len(result.chunks) > 1 and total == 200


def index_reads(source: Source) -> int:
    status: dict[str, Any] = {
        str(k): v for k, v in source.query("SHOW SESSION STATUS LIKE 'Handler_read%'")
    }
    return sum(
        int(status[k])
        for k in (
            "Handler_read_first",
            "Handler_read_key",
            "Handler_read_next",
            "Handler_read_prev",
            "Handler_read_last",
        )
    )


@pytest.mark.parametrize(
    "ddl",
    [
        "a INT NOT NULL, b INT NOT NULL, PRIMARY KEY (a, b)",
        "a INT NOT NULL, b INT NOT NULL, PRIMARY KEY (b, a)",
    ],
)
def test_index_walks_read_each_entry_about_once(conn: Any, source: Source, ddl: str) -> None:
    rows = [(i % 4, i * 7919 % 100_003) for i in range(6000)]  # skewed leading column
    table = build(conn, "walked", ddl, rows)
    before = index_reads(source)
    result = plan(source, table, 150)
    reads = index_reads(source) - before
    assert result.strategy == "uneven" and len(result.chunks) == 40
    # one pass over the index (6000) plus a few dives; a scan per chunk would be ~40 x 6000
    assert reads < 1.2 * len(rows), reads


# --------------------------------------------------------------------------- the CLI

CLI_TABLES: dict[str, tuple[str, list[tuple[Any, ...]]]] = {
    "orders": (
        "id BIGINT NOT NULL PRIMARY KEY, status VARCHAR(10)",
        [(i, "open" if i % 4 else "shipped") for i in range(1, 2001)],
    ),
    "events": (
        "id BIGINT UNSIGNED NOT NULL PRIMARY KEY",
        [(k,) for k in [*range(1, 301), *(10**12 + 13 * i for i in range(400)), 2**64 - 1]],
    ),
    "items": (
        "order_id INT NOT NULL, sku VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL,"
        " PRIMARY KEY (order_id, sku)",
        [(i % 3, f"s{i}'\\%\"{chr(0x1F600 + i % 3)}") for i in range(900)],
    ),
    "codes": (
        "code VARCHAR(30) NOT NULL, note INT, UNIQUE KEY u_code (code)",
        [(f"c-{i:05d}'\\\0", i) for i in range(500)],
    ),
    "empty": ("id INT NOT NULL PRIMARY KEY", []),
}


@pytest.fixture(scope="module")
def cli_db(server: LocalMariaDB, conn: Any) -> str:
    database = "chunk_cli"
    run(conn, f"DROP DATABASE IF EXISTS {database}")
    run(conn, f"CREATE DATABASE {database}")
    for name, (ddl, rows) in CLI_TABLES.items():
        build(conn, name, ddl, rows)
        run(conn, f"RENAME TABLE {DB}.{name} TO {database}.{name}")
    run(conn, f"CREATE TABLE {database}.heap (a INT, b INT)")
    server.create_user("planner", "S3cr3t-pw!", replication=False)
    return database


def tidemark(
    tmp_path: Path, server: LocalMariaDB, tables: list[dict[str, Any]], *args: str
) -> subprocess.CompletedProcess[str]:
    data = pipeline_config(tmp_path, server, tables)
    data["source"] = server.source_config(user="planner") | {"password_env": "PLAN_TEST_PASSWORD"}
    path = write_config(tmp_path / "plan.yaml", data)
    env = os.environ | {"PLAN_TEST_PASSWORD": "S3cr3t-pw!"}
    return subprocess.run(
        [TIDEMARK, "plan", "--config", str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_plan_json_returns_every_row_exactly_once(
    tmp_path: Path, server: LocalMariaDB, cli_db: str, source: Source
) -> None:
    tables: list[dict[str, Any]] = [
        {"name": f"{cli_db}.orders", "chunk_size": 150, "where": "status = 'open'"},
        {"name": f"{cli_db}.events", "chunk_size": 64},
        {"name": f"{cli_db}.items", "chunk_size": 100},
        {"name": f"{cli_db}.codes", "chunk_size": 70, "chunk_key": ["code"]},
        {"name": f"{cli_db}.empty"},
    ]
    done = tidemark(tmp_path, server, tables, "--json")
    assert done.returncode == 0, done.stderr
    assert "S3cr3t" not in done.stdout + done.stderr
    document = json.loads(done.stdout)
    plans = {t["table"]: t for t in document["tables"]}
    assert list(plans) == [t["name"] for t in tables]
    assert plans[f"{cli_db}.orders"]["strategy"] == "even"
    assert plans[f"{cli_db}.events"]["strategy"] == "uneven"
    assert plans[f"{cli_db}.empty"] == {
        "table": f"{cli_db}.empty",
        "strategy": "empty",
        "read_by": "none",
        "chunk_key": ["id"],
        "reason": "no rows",
        "chunks": [],
    }
    assert {plans[f"{cli_db}.events"]["read_by"], plans[f"{cli_db}.orders"]["read_by"]} <= {
        "driver",
        "spark",
    }
    for spec in tables:
        entry = plans[spec["name"]]
        key = ", ".join(f"`{c}`" for c in entry["chunk_key"])
        expected = Counter(
            source.query(f"SELECT {key} FROM {spec['name']} WHERE {spec.get('where', '1 = 1')}")
        )
        got: Counter[tuple[Any, ...]] = Counter()
        for i, chunk in enumerate(entry["chunks"]):
            assert chunk["index"] == i
            assert set(chunk) == {"index", "where", "start", "end", "end_inclusive"}
            got.update(source.query(f"SELECT {key} FROM {spec['name']} WHERE {chunk['where']}"))
            assert (chunk["start"] is None) == (i == 0)
            assert chunk["end_inclusive"] == (i == len(entry["chunks"]) - 1)
            assert decode_key(chunk["end"]) is not None
        assert got == expected, spec["name"]
        assert max(got.values(), default=1) == 1


def test_plan_human_output(tmp_path: Path, server: LocalMariaDB, cli_db: str) -> None:
    done = tidemark(
        tmp_path,
        server,
        [
            {"name": f"{cli_db}.orders", "chunk_size": 500},
            {"name": f"{cli_db}.events", "chunk_size": 500},
        ],
        "--table",
        f"{cli_db}.events",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:6] == ["table", "strategy", "read", "by", "chunks", "rows"]
    assert lines[1].split()[:5] == [
        f"{cli_db}.events",
        "uneven",
        "driver",
        "1",
        "701",
    ]  # a 201-row tail joins
    assert "18446744073709551615" in lines[1] and len(lines) == 2
    assert f"table {cli_db}.events: strategy uneven" in done.stderr  # the decision log line


def test_a_unique_key_to_choose_is_refused_until_configured(
    tmp_path: Path, server: LocalMariaDB, cli_db: str
) -> None:
    done = tidemark(tmp_path, server, [{"name": f"{cli_db}.codes"}], "--json")
    assert done.returncode == 2
    assert "has no primary key; set chunk_key: [code]" in done.stderr and done.stdout == ""


def test_a_table_without_any_key_is_planned_as_a_multiset(
    tmp_path: Path, server: LocalMariaDB, cli_db: str
) -> None:
    done = tidemark(tmp_path, server, [{"name": f"{cli_db}.heap"}], "--json")
    assert done.returncode == 0, done.stderr
    (table,) = json.loads(done.stdout)["tables"]
    assert (table["strategy"], table["read_by"], table["chunk_key"]) == ("keyless", "driver", [])
    assert [c["where"] for c in table["chunks"]] == ["1 = 1"]
    assert "published as the multiset of its rows" in table["reason"]
