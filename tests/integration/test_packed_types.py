"""MariaDB's INET4, INET6 and UUID (docs/types.md): published as the text the server prints,
whether the row was read by Spark, by the driver or applied from the binlog, with UUID and INET6
primary keys chunked in the server's order (a UUID's stored, swapped form). The binlog holds the
values' bytes, which `orchestrator.schema.packed` prints; the server prints thousands of them
beside it here.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.schema.packed import inet4_text, inet6_text, uuid_text
from tests.conftest import fresh_database, load_pipeline
from tests.iceberg_readers import assert_readers_equal_source, pyiceberg_table
from tests.integration.conftest import run_plain

pytestmark = pytest.mark.integration

DB = "packed_types"

#: INET6 values (hex) reaching each way the server prints one: all zero, ``::1``, IPv4-mapped
#: and -compatible, a single zero word compressed, the first of two equal zero runs, trailing
#: zeros (which the binlog drops), no zero word, the mapped prefix without its mapped address.
INET6 = [
    "00000000000000000000000000000000",
    "00000000000000000000000000000001",
    "00000000000000000000ffff01020304",
    "00000000000000000000000001020304",
    "00010000000200030004000500060007",
    "00010000000000010000000000000000",
    "00010000000000020003000000000004",
    "20010db8000000000000ff0000428329",
    "ffffffffffffffffffffffffffffffff",
    "00000000000000000000ffff00000000",
    "0000000000000000000000000000ffff",
    "00000000000000000000fffe01020304",
    "fe800000000000000000000000000000",
]
#: UUIDs (hex) the server stores swapped (version 1 to 5 with the variant bit: v1, v4) and not
#: (v7, v0, the NCS variant), with trailing zeros, in no particular order.
UUIDS = [
    "6ccd780cbaba102695645b8c656024db",
    "0123456789ab4def8123456789abcdef",
    "1123456789ab7def8123456789abcdef",
    "2123456789ab1defc123456789abcdef",
    "00000000000000000000000000000001",
    "10000000000000000000000000000000",
    "ffffffff0000100080000000000000000"[:32],
    "00112233445566770899aabbccddeeff",
    "018f1e2a3b4c7d5e9f00112233445566",
    "c0ffee00000040008000000000000000",
    "a0000000000050009000000000000000",
    "0000000000003fffbfff000000000000",
]
INET4 = ["01020304", "ffffffff", "00000000", "0a000000", "c0a80100", "7f000001"]


def _random_inet6(rng: random.Random) -> str:
    """16 bytes whose words are zero half the time: every shape of zero runs."""
    return "".join(
        "0000" if rng.random() < 0.5 else f"{rng.randrange(1, 65536):04x}" for _ in "12345678"
    )


def test_the_printers_give_the_servers_text(mariadb: LocalMariaDB) -> None:
    rng = random.Random(7)
    inet6 = [*INET6, *(_random_inet6(rng) for _ in range(3000))]
    uuids = [*UUIDS, *(f"{rng.getrandbits(128):032x}" for _ in range(1000))]
    inet4 = [*INET4, *(f"{rng.getrandbits(32):08x}" for _ in range(300))]
    fresh_database(
        mariadb,
        DB,
        "CREATE TABLE b (kind VARCHAR(5), v VARBINARY(16))",
        "INSERT INTO b VALUES "
        + ", ".join(
            f"('{kind}', X'{value}')"
            for kind, values in (("inet6", inet6), ("uuid", uuids), ("inet4", inet4))
            for value in values
        ),
    )
    printers = {"inet6": inet6_text, "uuid": uuid_text, "inet4": inet4_text}
    checked = 0
    for kind, printer in printers.items():
        rows = mariadb.execute(
            f"SELECT HEX(v), CAST(CAST(v AS {kind.upper()}) AS CHAR) FROM b WHERE kind = '{kind}'",
            database=DB,
        )
        for hexed, text in rows:
            if text is None:  # a UUID the server refuses (version 8 or more, variant 0)
                continue
            assert printer(bytes.fromhex(hexed)) == text, (kind, hexed)
            checked += 1
    assert checked > 4000


def _create(mariadb: LocalMariaDB) -> None:
    fresh_database(mariadb, DB)
    for table in ("spark", "driver"):
        mariadb.execute(
            f"CREATE TABLE {table} (id UUID PRIMARY KEY, n INT NOT NULL, a INET6 NOT NULL, "
            "b INET4, u UUID)",
            database=DB,
        )
    mariadb.execute("CREATE TABLE byip (ip INET6 PRIMARY KEY, v4 INET4 UNIQUE, n INT)", database=DB)


def _rows(first: int) -> list[str]:
    """One row per UUID: its INET6, INET4 and second UUID taken from the lists in turn."""
    rows = []
    for i, key in enumerate(UUIDS):
        # the key's first byte is changed for the binlog's rows: another UUID, the same shape
        ident = f"{(int(key[:2], 16) + first) % 256:02x}{key[2:]}"
        b = "NULL" if i % 4 == 3 else f"CAST(X'{INET4[i % len(INET4)]}' AS INET4)"
        u = "NULL" if i % 3 == 2 else f"CAST(X'{UUIDS[-1 - i]}' AS UUID)"
        rows.append(
            f"(CAST(X'{ident}' AS UUID), {first + i}, CAST(X'{INET6[i % len(INET6)]}' AS INET6), "
            f"{b}, {u})"
        )
    return rows


def test_values_and_keys_are_the_servers_text_on_every_path(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    _create(mariadb)
    for table in ("spark", "driver"):
        mariadb.execute(f"INSERT INTO {table} VALUES {', '.join(_rows(0))}", database=DB)
    v4 = ["NULL" if i % 5 == 4 else f"'{i}.0.0.0'" for i in range(len(INET6))]
    mariadb.execute(
        "INSERT INTO byip VALUES "
        + ", ".join(f"(CAST(X'{ip}' AS INET6), {v4[i]}, {i})" for i, ip in enumerate(INET6)),
        database=DB,
    )
    config = load_pipeline(
        tmp_path,
        mariadb,
        [
            {"name": f"{DB}.spark", "chunk_size": 2},  # Spark's read, ranges of UUIDs
            {"name": f"{DB}.driver"},
            {"name": f"{DB}.byip", "chunk_size": 3},  # ranges of INET6 addresses
        ],
        name=DB,
        defaults={"read_margin_seconds": 0.0},
    )
    run_plain(config)
    for table in ("spark", "driver"):  # the same values by the binlog, and changed ones
        mariadb.execute(
            f"INSERT INTO {table} VALUES {', '.join(_rows(100))}",
            f"UPDATE {table} SET a = '::ffff:10.0.0.0', b = '0.0.0.0', u = NULL WHERE n = 1",
            f"UPDATE {table} SET id = '10000000-0000-0000-0000-0000000000ff' WHERE n = 5",
            f"DELETE FROM {table} WHERE n = 2",
            database=DB,
        )
    mariadb.execute(
        "INSERT INTO byip VALUES ('1::', '9.0.0.0', 100), ('::fffe:1.2.3.5', NULL, 101)",
        "UPDATE byip SET ip = '2::', v4 = '10.0.0.1' WHERE n = 0",
        "DELETE FROM byip WHERE n = 3",
        database=DB,
    )
    run_plain(config)

    assert_readers_equal_source(config, [f"{DB}.spark", f"{DB}.driver", f"{DB}.byip"])
    for table in ("spark", "driver"):
        by_n = {r["n"]: r for r in pyiceberg_table(config, f"{DB}.{table}").to_pylist()}
        for i in range(3, len(UUIDS)):  # read by the snapshot == applied from the binlog
            if i != 5:
                snapshot, binlog = by_n[i], by_n[100 + i]
                assert [snapshot[c] for c in "abu"] == [binlog[c] for c in "abu"], (table, i)
    spark_rows = {r["n"]: r for r in pyiceberg_table(config, f"{DB}.spark").to_pylist()}
    driver_rows = {r["n"]: r for r in pyiceberg_table(config, f"{DB}.driver").to_pylist()}
    assert spark_rows == driver_rows
    assert spark_rows[1]["a"] == "::ffff:10.0.0.0" and spark_rows[1]["u"] is None
