"""The fast decoder (orchestrator.binlog) against python-mysql-replication's, value for
value, on a real MariaDB: every type of the mapping, edge sizes and random values, key
changes, multi-row events and a big transaction; plus what the fast path refuses."""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.binlog.pool import POOL_BYTES
from orchestrator.config import parse_config
from orchestrator.pipeline.capture import pooled
from orchestrator.pipeline.capture.step import CaptureTable, capture_changes
from orchestrator.pipeline.segments import read_changes
from orchestrator.positions import BinlogPosition
from orchestrator.state.store import StateStore
from tests.conftest import fresh_database, pipeline_config
from tests.integration.test_binlog import (
    NINES,
    TYPES_DDL,
    TYPES_ROWS,
    TYPES_UPDATE,
    new_york_tz,
    position,
    table_info,
)

pytestmark = pytest.mark.integration
__all__ = ["new_york_tz"]  # the fixture, imported to be used here


def capture_both(
    tmp_path: Path,
    server: LocalMariaDB,
    name: str,
    key: tuple[str, ...],
    start: BinlogPosition,
    stop: BinlogPosition,
    batch_rows: int = 50_000,
) -> tuple[pa.Table, pa.Table]:
    """The table's changes captured with the library decoder, then with the fast one. The fast
    one also decodes in worker processes (`orchestrator.binlog.pool`, forced here for any size,
    in jobs of a few events) and must write the same changes there."""
    config = parse_config(pipeline_config(tmp_path, server, [{"name": name}], name="fast"))
    store = StateStore(config.state.url)
    tables = {name: CaptureTable(table_info(server, name), key, start)}
    out = []
    for decoder, pool_bytes in (("library", POOL_BYTES), ("fast", POOL_BYTES), ("fast", 0)):
        run_id = store.create_run("fast", {}).run_id
        with mock.patch.object(pooled, "JOB_BYTES", 4096):
            capture_changes(
                config,
                store,
                run_id,
                tables,
                stop,
                batch_rows=batch_rows,
                decoder=decoder,
                pool_bytes=pool_bytes,
            )
        out.append(read_changes(store, config.staging_path, run_id, name))
    library, fast, in_workers = out
    assert in_workers.equals(fast), "the workers decode as the capture does"
    return library, fast


def float_bits(values: list[Any]) -> list[Any]:
    """Floats as their bit patterns (so -0.0 and 0.0 differ)."""
    return [v if v is None else struct.pack("<d", v) for v in values]


def assert_identical(library: pa.Table, fast: pa.Table) -> None:
    assert fast.schema.equals(library.schema, check_metadata=True)
    assert fast.num_rows == library.num_rows > 0
    for name in library.column_names:
        expected, got = library.column(name).to_pylist(), fast.column(name).to_pylist()
        if pa.types.is_floating(library.schema.field(name).type):
            expected, got = float_bits(expected), float_bits(got)
        assert got == expected, name


def run_sql(server: LocalMariaDB, database: str, *statements: str) -> None:
    """Statements in one session, in non-strict mode and UTC (zero dates, odd values)."""
    conn = server.connect(charset="utf8mb4", database=database)
    try:
        with conn.cursor() as cur:
            cur.execute("SET sql_mode = 'ALLOW_INVALID_DATES', time_zone = '+00:00'")
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


# --------------------------------------------------------------------------- every type

#: Generated values for the every-type table, one expression per column, from ``seq``.
GENERATED = """
  1000 + seq, seq % 256 - 128, seq % 256, seq * 7 % 65536 - 32768, seq * 7 % 65536,
  seq * 13 % 16777216 - 8388608, seq * 13 % 16777216, seq * 104729 % 4294967296 - 2147483648,
  seq * 104729 % 4294967296, seq * 1000000007 * IF(seq % 2, -1, 1), 18446744073709551615 - seq,
  IF(seq % 10 = 0, 0, 1901 + seq % 255), seq * 7919 % 10000000000 / 100 * IF(seq % 3, 1, -1),
  CAST(CONCAT(IF(seq % 2, '-', ''), seq * 123456789, '.', LPAD(seq, 10, '0')) AS DECIMAL(38,10)),
  CAST(CONCAT(IF(seq % 3, '-', ''), REPEAT(seq % 10, 35), '.', LPAD(seq * 7, 30, '0'))
       AS DECIMAL(65,30)),
  seq / 7 * IF(seq % 2, -1, 1), seq / 3.3 * IF(seq % 3, 1, -1), seq % 2, seq % 3 - 1,
  seq % 1024, 18446744073709551615 - seq * 2654435761,
  IF(seq % 5 = 0, NULL, LEFT(CONCAT('c', seq, '   '), 5)),
  IF(seq % 4 = 0, CONVERT(x'E9E8' USING latin1), 'ab '), CONCAT('vc', seq, '😀'),
  IF(seq % 2, CONVERT(x'E98180' USING latin1), CONCAT('v', seq)), REPEAT('ü', seq % 100),
  IF(seq % 50 = 0, REPEAT('x', 70000), CONCAT('m', seq)), ELT(seq % 4 + 1, 'x', 'y', 'z', 'q'),
  ELT(seq % 5 + 1, '', 'b', 'a,c', 'b,a,c', 'c'), JSON_OBJECT('s', seq, 'u', 'ü'),
  IF(seq % 3 = 0, x'61', UNHEX(LPAD(HEX(seq), 8, '0'))), UNHEX(HEX(seq * seq)),
  IF(seq % 7 = 0, NULL, REPEAT(x'00ff', seq % 40)),
  IF(seq % 11 = 0, '0000-00-00', DATE('2000-01-01') + INTERVAL seq DAY),
  IF(seq % 12 = 0, '0000-00-00 00:00:00', TIMESTAMP('1000-01-01') + INTERVAL seq * 86399 SECOND),
  TIMESTAMP('2020-01-01') + INTERVAL seq * 37 SECOND + INTERVAL seq MICROSECOND,
  FROM_UNIXTIME(seq * 100000), IF(seq % 13 = 0, NULL, FROM_UNIXTIME(1 + seq * 333333 + 0.123)),
  SEC_TO_TIME(seq * 53 - 100000), SEC_TO_TIME(seq * 1.1 - 2000), SEC_TO_TIME(seq * 1.21 - 2000),
  SEC_TO_TIME(seq * 1.234 - 2000), SEC_TO_TIME(seq * 1.2345 - 2000),
  SEC_TO_TIME(seq * 1.23456 - 2000), SEC_TO_TIME(seq * -1.234567 + 2000),
  CAST(UNHEX(IF(seq % 2, LPAD(HEX(seq * 2654435761), 32, '0'), RPAD(HEX(seq), 32, '0'))) AS INET6),
  IF(seq % 9 = 0, NULL, CAST(UNHEX(LPAD(HEX(seq * 104729 % 4294967296), 8, '0')) AS INET4)),
  IF(seq % 6 = 0, NULL, CAST(UNHEX(CONCAT(LEFT(MD5(seq), 12), IF(seq % 2, '4', '7'),
     SUBSTR(MD5(seq), 14, 3), '8', SUBSTR(MD5(seq), 18))) AS UUID))
"""


def test_every_type_fast_equals_library(
    tmp_path: Path, mariadb: LocalMariaDB, new_york_tz: None
) -> None:
    """Both decoders write the same segments for every type of the mapping: single- and
    multi-row events, key-changing updates, deletes, and a transaction bigger than a segment.
    The key includes odd types, so before images of each are compared too."""
    ddl = TYPES_DDL.replace("cap_types.", "fast_types.")
    fresh_database(mariadb, "fast_types", ddl)
    start = position(mariadb)
    multi = ", ".join(
        row.replace(f"({i}", f"({i + 10}", 1) for i, row in enumerate(TYPES_ROWS, start=1)
    )
    run_sql(
        mariadb,
        "fast_types",
        *[f"INSERT INTO fast_types.t VALUES {row}" for row in TYPES_ROWS],
        f"INSERT INTO fast_types.t VALUES {multi}",  # one multi-row event
        TYPES_UPDATE.replace("cap_types.", "fast_types."),
        "UPDATE fast_types.t SET id = id + 100 WHERE id IN (2, 3, 12)",  # key changes
        "DELETE FROM fast_types.t WHERE id IN (1, 4, 14)",
        "BEGIN",
        f"INSERT INTO fast_types.t SELECT {GENERATED}"
        " FROM (SELECT CAST(seq AS SIGNED) AS seq FROM seq_1_to_3000) AS s",
        "UPDATE fast_types.t SET i32 = i32 + 1, vc = CONCAT(vc, 'u'), d65 = -d65, st = 'a',"
        " dt6 = dt6 + INTERVAL 1 SECOND, id = id + 10000 WHERE id > 1000 AND id % 3 = 0",
        "UPDATE fast_types.t SET t3 = '-00:00:00.5', ts0 = NULL, bn = x'00', js = NULL,"
        " f = -0.0 WHERE id > 1000 AND id % 3 = 1",
        "DELETE FROM fast_types.t WHERE id > 1000 AND id % 5 = 0",
        "COMMIT",
    )
    stop = position(mariadb)

    library, fast = capture_both(
        tmp_path,
        mariadb,
        "fast_types.t",
        ("id", "d65", "dt6", "vl", "bn", "t6"),
        start,
        stop,
        batch_rows=700,
    )
    assert_identical(library, fast)
    ops = fast.column("_tm_op").to_pylist()
    assert {op: ops.count(op) for op in "IUD"} == {"I": 3010, "U": 3004, "D": 603}
    # A few values spelled out, so a shared mistake cannot hide.
    rows = {(r["_tm_op"], r["id"]): r for r in fast.to_pylist()}
    assert rows[("I", 2)]["u64"] == 18446744073709551615 and rows[("I", 2)]["b64"] == -1
    assert rows[("I", 1)]["d65"] == "-" + NINES and rows[("I", 3)]["t1"] == -100_000
    assert rows[("U", 102)]["_tm_old_id"] == 2 and rows[("U", 102)]["_tm_old_vl"] == "é\x81"
    assert rows[("D", 4)]["_tm_old_dt6"] is None and rows[("I", 13)]["dd"] is None
    assert rows[("I", 3)]["bn"] == b"a\0\0\0" and rows[("I", 2)]["st"] == "b,a,c"


# --------------------------------------------------------------------------- edge sizes

EDGE_DDL = """
CREATE TABLE fast_edge.t (
  id INT PRIMARY KEY,
  d1 DECIMAL(1,0), d5_5 DECIMAL(5,5), d9 DECIMAL(9,0), d18_9 DECIMAL(18,9), d19_4 DECIMAL(19,4),
  d30 DECIMAL(30,0), d38_38 DECIMAL(38,38), d39_1 DECIMAL(39,1), d40_20 DECIMAL(40,20),
  dt1 DATETIME(1), dt2 DATETIME(2), dt3 DATETIME(3), dt4 DATETIME(4), dt5 DATETIME(5),
  ts1 TIMESTAMP(1) NULL, ts2 TIMESTAMP(2) NULL, ts4 TIMESTAMP(4) NULL, ts5 TIMESTAMP(5) NULL,
  ts6 TIMESTAMP(6) NULL, b2 BIT(2), b8 BIT(8), b9 BIT(9), b17 BIT(17), b33 BIT(33), b63 BIT(63),
  s9 SET({s9}), s17 SET({s17}), s33 SET({s33}), s64 SET({s64}), e300 ENUM({e300}),
  vlong VARCHAR(300), vlat VARCHAR(300) CHARACTER SET latin1, c255 CHAR(255),
  cbin BINARY(255), tt TINYTEXT, tb TINYBLOB, mb MEDIUMBLOB, lb LONGBLOB,
  lt LONGTEXT CHARACTER SET latin1, u2 VARCHAR(10) CHARACTER SET ucs2,
  cp VARCHAR(10) CHARACTER SET cp1251, gr CHAR(10) CHARACTER SET greek, yr YEAR, dd DATE,
  sm SMALLINT UNSIGNED, md MEDIUMINT, fl FLOAT, tf TINYINT(1) UNSIGNED
) DEFAULT CHARSET = utf8mb4
"""
EDGE_COLUMNS = 49


def labels(prefix: str, count: int) -> str:
    return ", ".join(f"'{prefix}{i}'" for i in range(count))


def sql_text(rng: random.Random, pool: str, longest: int) -> str:
    text = "".join(rng.choice(pool) for _ in range(rng.randrange(longest + 1)))
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def hex_literal(raw: bytes) -> str:
    return f"x'{raw.hex()}'" if raw else "''"


def decimal_literal(rng: random.Random, precision: int, scale: int) -> str:
    digits = "".join(rng.choice("0123456789") for _ in range(precision))
    whole, fraction = digits[: precision - scale] or "0", digits[precision - scale :]
    return f"{rng.choice(['', '-'])}{whole}{'.' + fraction if fraction else ''}"


def datetime_literal(rng: random.Random, fsp: int) -> str:
    roll = rng.random()
    if roll < 0.05:
        return "'0000-00-00 00:00:00'"
    if roll < 0.1:  # zero in the date: NULL in both paths (a day the month does not have
        # rolls over in the fast decoder, as the snapshot's DATEDIFF counts it, and is NULL in
        # the library's: integration/test_value_edges.py holds the fast one to the snapshot)
        return "'2021-00-05 01:02:03.5'"
    stamp = (
        f"{rng.randrange(1000, 10000):04d}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        f" {rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
    )
    return f"'{stamp}.{rng.randrange(10**6):06d}'"


def edge_value(rng: random.Random, column: str) -> str:
    """A random SQL literal for an EDGE_DDL column (NULL now and then)."""
    if rng.random() < 0.12:
        return "NULL"
    kind = column.rstrip("0123456789_")
    sizes = [int(x) for x in column[len(kind) :].split("_") if x]
    if kind == "d":
        return decimal_literal(rng, sizes[0], sizes[1] if len(sizes) > 1 else 0)
    if kind == "dt":
        return datetime_literal(rng, sizes[0])
    if kind == "ts":
        return f"FROM_UNIXTIME({rng.randrange(1, 2**31 - 1)}.{rng.randrange(10**6):06d})"
    if kind == "b":
        return str(rng.getrandbits(sizes[0]))
    if kind == "s":
        return str(rng.getrandbits(sizes[0]))
    if kind == "e":
        return str(rng.randrange(1, 301))
    texts = {
        "vlong": ("aé😀 z'\\", 300),
        "vlat": ("ab\x81é€ ", 300),
        "c255": ("é😀a  ", 255),
        "tt": ("xyü", 80),
        "u2": ("aéЖ€", 10),
        "cp": ("абв d", 10),
        "gr": ("αβγ ", 10),
    }
    if column in texts:
        return sql_text(rng, *texts[column])
    if column == "lt":
        return f"REPEAT({sql_text(rng, 'ab€', 3)}, {rng.choice([0, 1, 100000])})"
    if column in ("cbin", "tb", "mb", "lb"):
        size = {"cbin": 255, "tb": 255, "mb": 70000, "lb": 300}[column]
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(min(size, 300) + 1)))
        return hex_literal((raw + b"\0" * rng.randrange(3))[:size])
    return {
        "yr": lambda: str(rng.choice([0, 1901, 2155, rng.randrange(1901, 2156)])),
        "dd": lambda: rng.choice(
            ["'0000-00-00'", "'2021-00-05'", f"'{rng.randrange(1000, 10000)}-02-28'"]
        ),
        "sm": lambda: str(rng.randrange(65536)),
        "md": lambda: str(rng.randrange(-(2**23), 2**23)),
        "fl": lambda: repr(rng.uniform(-1e30, 1e30)),
        "tf": lambda: str(rng.randrange(256)),
    }[column]()


def test_edge_sizes_and_random_values_fast_equals_library(
    tmp_path: Path, mariadb: LocalMariaDB
) -> None:
    """DECIMALs of every group layout, each fsp, BIT and SET widths, a 2-byte ENUM, 2-byte
    string lengths, blob length sizes, single-byte and UCS-2 charsets, invalid dates: random
    values, then random updates (some changing the key) and deletes."""
    ddl = EDGE_DDL.format(
        s9=labels("a", 9),
        s17=labels("b", 17),
        s33=labels("c", 33),
        s64=labels("d", 64),
        e300=labels("e", 300),
    )
    fresh_database(mariadb, "fast_edge", ddl)
    info = table_info(mariadb, "fast_edge.t")
    names = [c.name for c in info.columns]
    assert len(names) == EDGE_COLUMNS
    rng = random.Random(20261122)
    start = position(mariadb)
    statements = []
    for first in range(0, 400, 20):  # multi-row inserts
        rows = [
            f"({i}, {', '.join(edge_value(rng, n) for n in names[1:])})"
            for i in range(first, first + 20)
        ]
        statements.append(f"INSERT INTO fast_edge.t VALUES {', '.join(rows)}")
    for _ in range(150):
        target = rng.randrange(400)
        changes = [f"{n} = {edge_value(rng, n)}" for n in rng.sample(names[1:], 4)]
        if rng.random() < 0.2:
            changes.append(f"id = {target + 1000}")
        statements.append(f"UPDATE IGNORE fast_edge.t SET {', '.join(changes)} WHERE id = {target}")
    statements.append("UPDATE fast_edge.t SET ts6 = NULL, dt5 = dt5 WHERE id % 7 = 0")
    statements.append("DELETE FROM fast_edge.t WHERE id % 9 = 0")
    run_sql(mariadb, "fast_edge", *statements)
    stop = position(mariadb)

    library, fast = capture_both(
        tmp_path, mariadb, "fast_edge.t", ("id", "d40_20", "s33", "dt3", "gr"), start, stop
    )
    assert_identical(library, fast)
    assert library.num_rows > 500


# --------------------------------------------------------------------------- checksums


def test_files_with_and_without_checksums(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    """Each binlog file keeps the binlog_checksum it was written with, and the server sends
    its events as they are: whether an event ends with a CRC32 is the file's business, not
    the server's setting when the stream connects."""
    fresh_database(
        mariadb,
        "fast_crc",  # rows of 2 bytes: shorter than a checksum
        "CREATE TABLE fast_crc.t (id TINYINT PRIMARY KEY, v VARCHAR(20))",
    )
    start = position(mariadb)
    results = []
    try:
        mariadb.execute(
            "INSERT INTO fast_crc.t VALUES (1, 'a'), (2, NULL)",
            "SET GLOBAL binlog_checksum = NONE",
            "INSERT INTO fast_crc.t VALUES (3, 'c'), (4, NULL), (5, NULL)",
            "UPDATE fast_crc.t SET v = 'x', id = id + 10 WHERE id < 3",
            "SET GLOBAL binlog_checksum = CRC32",
            "DELETE FROM fast_crc.t WHERE id > 3",
        )
        stop = position(mariadb)
        for setting in ("NONE", "CRC32"):  # as the stream connects
            mariadb.execute(f"SET GLOBAL binlog_checksum = {setting}")
            results.append(
                capture_both(tmp_path / setting, mariadb, "fast_crc.t", ("id",), start, stop)
            )
    finally:
        mariadb.execute("SET GLOBAL binlog_checksum = CRC32")
    for library, fast in results:
        assert_identical(library, fast)
        assert fast.equals(results[0][1])
    fast = results[0][1]
    assert fast.column("_tm_op").to_pylist() == ["I"] * 5 + ["U"] * 2 + ["D"] * 4
    assert len(set(fast.column("_tm_file").to_pylist())) == 3
    assert fast.column("id").to_pylist() == [1, 2, 3, 4, 5, 11, 12, 4, 5, 11, 12]


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("image", ["MINIMAL", "NOBLOB"])
def test_rows_without_full_images_are_a_re_read(
    tmp_path: Path, mariadb: LocalMariaDB, image: str
) -> None:
    """A session that logs other than full row images (its own ``binlog_row_image``): the
    after-image is not the row's state, so the table is marked for a re-read at that event and
    none of its rows are kept; the other table's rows are."""
    db = f"fast_{image.lower()}"
    fresh_database(
        mariadb,
        db,
        f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v INT, b BLOB)",
        f"CREATE TABLE {db}.o (id INT PRIMARY KEY, v INT)",
    )
    mariadb.execute(f"INSERT INTO {db}.t VALUES (1, 1, 'x'), (2, 2, 'y')")
    start = position(mariadb)
    mariadb.execute(f"INSERT INTO {db}.t VALUES (3, 3, 'z')", f"INSERT INTO {db}.o VALUES (1, 1)")
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION binlog_row_image = '{image}'")
            cur.execute(f"UPDATE {db}.t SET v = 20 WHERE id = 2")
            cur.execute("SET SESSION binlog_row_image = 'FULL'")
            cur.execute(f"INSERT INTO {db}.o VALUES (2, 2)")
        conn.commit()
    finally:
        conn.close()
    mariadb.execute(f"UPDATE {db}.t SET v = 30 WHERE id = 3", f"INSERT INTO {db}.o VALUES (3, 3)")
    config = parse_config(
        pipeline_config(tmp_path, mariadb, [{"name": f"{db}.t"}, {"name": f"{db}.o"}])
    )
    store = StateStore(config.state.url)
    run_id = store.create_run("test", {}).run_id
    tables = {}
    for name in ("t", "o"):
        store.add_run_table(
            run_id, f"{db}.{name}", "snapshot", strategy=None, chunk_key=["id"], info={}
        )
        tables[f"{db}.{name}"] = CaptureTable(table_info(mariadb, f"{db}.{name}"), ("id",), start)
    result = capture_changes(config, store, run_id, tables, position(mariadb))
    assert result.rows == {f"{db}.t": 0, f"{db}.o": 3}  # t: re-read, none of its rows kept
    records = {r.table: r.info for r in store.run_tables(run_id)}
    assert records[f"{db}.t"]["reread_pending"]["what"].startswith(
        "a rows event without full row images"
    )
    assert "reread_pending" not in records[f"{db}.o"]


def test_a_changed_decimal_scale_is_a_re_read(tmp_path: Path, mariadb: LocalMariaDB) -> None:
    """Same binlog type, other scale: decoding with the planned scale would be wrong, so the
    TABLE_MAP of the new shape marks the table for a re-read (here the ALTER itself is before
    the table's start) and none of its rows after it are kept."""
    fresh_database(
        mariadb, "fast_scale", "CREATE TABLE fast_scale.t (id INT PRIMARY KEY, d DECIMAL(10,2))"
    )
    info = table_info(mariadb, "fast_scale.t")
    mariadb.execute("INSERT INTO fast_scale.t VALUES (1, 1.23)")
    mariadb.execute("ALTER TABLE fast_scale.t MODIFY d DECIMAL(12,4)")
    start = position(mariadb)
    mariadb.execute("INSERT INTO fast_scale.t VALUES (2, 1.2345)")
    config = parse_config(pipeline_config(tmp_path, mariadb, [{"name": "fast_scale.t"}]))
    store = StateStore(config.state.url)
    run_id = store.create_run("test", {}).run_id
    store.add_run_table(
        run_id, "fast_scale.t", "snapshot", strategy=None, chunk_key=["id"], info={}
    )
    result = capture_changes(
        config,
        store,
        run_id,
        {"fast_scale.t": CaptureTable(info, ("id",), start)},
        position(mariadb),
    )
    assert result.rows == {"fast_scale.t": 0}
    pending = store.run_tables(run_id)[0].info["reread_pending"]
    assert pending["what"].startswith("a TABLE_MAP of another shape (column `d` is decimal(10,2)")
