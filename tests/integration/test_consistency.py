"""The promise: after concurrent writes during a snapshot, the published tables equal the source.

Real private MariaDB, real local Spark, the real `tidemark run` code path; a
writer thread inserts, updates, deletes and changes primary keys throughout
the snapshot. Values are compared by the independent oracle in
`orchestrator.app.demo.verify`, including rows whose values came through the binlog.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.app.demo.sample import SHOP_TABLES, Writer, connect, load_shop
from orchestrator.app.run import run_command
from orchestrator.config import load_config
from orchestrator.lake.iceberg import open_catalog
from orchestrator.lake.manifest import read_manifest
from orchestrator.pipeline.context import table_dir
from tests.conftest import pipeline_config, write_config
from tests.iceberg_readers import assert_readers_equal_source

pytestmark = pytest.mark.integration

ALL_TYPES = """
CREATE TABLE {db}.all_types (
  id INT NOT NULL PRIMARY KEY,
  t_tiny TINYINT, t_tiny_u TINYINT UNSIGNED, t_small SMALLINT, t_small_u SMALLINT UNSIGNED,
  t_medium MEDIUMINT, t_medium_u MEDIUMINT UNSIGNED, t_int INT, t_int_u INT UNSIGNED,
  t_big BIGINT, t_big_u BIGINT UNSIGNED, t_year YEAR,
  t_dec DECIMAL(12, 4), t_dec_wide DECIMAL(50, 20), t_float FLOAT, t_double DOUBLE,
  t_bool TINYINT(1), t_bit1 BIT(1), t_bit BIT(12),
  t_char CHAR(5), t_varchar VARCHAR(50), t_text TEXT, t_enum ENUM('a', 'b b', 'c'), \
t_set SET('x', 'y', 'z'),
  t_json JSON, t_binary BINARY(4), t_varbinary VARBINARY(20), t_blob BLOB,
  t_date DATE, t_datetime DATETIME(6), t_timestamp TIMESTAMP(3) NULL, t_time TIME(6),
  t_inet6 INET6, t_uuid UUID
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""
#: A table keyed by a UUID, chunked in the server's order of UUIDs (their stored, swapped form),
#: and system-versioned: its rows events hold history rows, which are not its rows.
BY_UUID = (
    "CREATE TABLE {db}.by_uuid (id UUID PRIMARY KEY, n INT NOT NULL, ip INET4)"
    " WITH SYSTEM VERSIONING"
)


_COLUMNS = (
    "id, t_tiny, t_tiny_u, t_small, t_small_u, t_medium, t_medium_u, t_int, t_int_u, t_big,"
    " t_big_u, t_year, t_dec, t_dec_wide, t_float, t_double, t_bool, t_bit1, t_bit, t_char,"
    " t_varchar, t_text, t_enum, t_set, t_json, t_binary, t_varbinary, t_blob, t_date, t_datetime,"
    " t_timestamp, t_time, t_inet6, t_uuid"
)


def type_row(i: int, rng: random.Random) -> tuple[Any, ...]:
    """A row exercising edge values; every 7th row is all NULL but the key."""
    if i % 7 == 0:
        return (i,) + (None,) * 33
    edge = i % 3
    return (
        i,
        [-128, 127, 0][edge],
        [0, 255, 1][edge],
        [-32768, 32767, 5][edge],
        [0, 65535, 7][edge],
        [-8388608, 8388607, 9][edge],
        [0, 16777215, 3][edge],
        [-2147483648, 2147483647, i][edge],
        [0, 4294967295, i][edge],
        [-9223372036854775808, 9223372036854775807, -i][edge],
        [0, 18446744073709551615, 9223372036854775808 + i][edge],
        [1901, 2155, 2024][edge],
        f"{rng.randint(-(10**7), 10**7)}.{rng.randint(0, 9999):04d}",
        f"-{rng.randint(0, 10**29)}.{rng.randint(0, 10**19):020d}",
        rng.random() * 1000,
        rng.random() * 1e300,
        edge % 2,
        edge % 2,
        rng.randint(0, 4095),
        ["ab", "", "a b  "][edge],
        f"v'\\\"{i} é 🌊",
        "long " * (i % 50),
        ["a", "b b", "c"][edge],
        ["x,z", "", "y"][edge],
        f'{{"k": {i}, "s": "é"}}',
        bytes([i % 256, 0, 1]),
        bytes([0, 255, i % 256]),
        bytes(range(i % 256)),
        ["0000-00-00", "1000-01-01", "2024-02-29"][edge],
        ["9999-12-31 23:59:59.999999", "1000-01-01 00:00:00.000001", "2024-06-30 12:00:00.5"][edge],
        ["1970-01-01 00:00:01.000", "2038-01-19 03:14:07.999", "2024-03-10 02:30:00.123"][edge],
        ["-838:59:59.000000", "838:59:59.000000", "-00:00:01.250000"][edge],
        [f"::ffff:10.0.{i % 256}.1", "::", f"2001:db8::{i:x}:0"][edge],
        random_uuid(rng),
    )


def random_uuid(rng: random.Random) -> str:
    """A UUID the server stores swapped (version 1, 4) or not (version 7)."""
    value = rng.getrandbits(128) & ~(0xF << 76) & ~(0x3 << 62) | (1 << 63)  # variant 10
    return str(uuid.UUID(int=value | (rng.choice((1, 4, 7)) << 76)))


class TypesWriter(threading.Thread):
    """Changes the all-types table, with every kind of change, until stopped."""

    def __init__(self, server: LocalMariaDB, db: str, first_new: int) -> None:
        super().__init__(daemon=True)
        self.server, self.db, self.next = server, db, first_new
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(11)
        try:
            conn = connect("127.0.0.1", self.server.port, "root", "", self.db)
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00', sql_mode = ''")
                while not self.stop_event.is_set():
                    k = rng.randrange(1, self.next)
                    action = rng.random()
                    if action < 0.3:
                        cur.execute(
                            f"INSERT INTO all_types ({_COLUMNS}) VALUES ({', '.join(['%s'] * 34)})",
                            type_row(self.next, rng),
                        )
                        self.next += 1
                    elif action < 0.6:
                        row = type_row(k + 1, rng)
                        cur.execute(
                            "UPDATE all_types SET t_varchar = %s, t_dec = %s, t_time = %s,"
                            " t_json = %s, t_big_u = %s, t_bit = %s, t_timestamp = %s,"
                            " t_inet6 = %s, t_uuid = %s WHERE id = %s",
                            (*(row[c] for c in (20, 12, 31, 24, 10, 18, 30, 32, 33)), k),
                        )
                    elif action < 0.75:
                        cur.execute("DELETE FROM all_types WHERE id = %s", (k,))
                    elif action < 0.85:
                        cur.execute(
                            "UPDATE IGNORE all_types SET id = id + 100000 WHERE id = %s", (k,)
                        )
                    else:
                        cur.execute(
                            "UPDATE all_types SET t_text = NULL, t_blob = NULL, t_date = NULL"
                            " WHERE id = %s",
                            (k,),
                        )
                    self._by_uuid(cur, rng)
                    self.stop_event.wait(0.002)
            conn.close()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _by_uuid(self, cur: Any, rng: random.Random) -> None:
        """One change to ``by_uuid``: a row inserted, changed, deleted or given another key."""
        cur.execute("SELECT id FROM by_uuid ORDER BY id LIMIT 1 OFFSET %s", (rng.randrange(100),))
        found = cur.fetchone()
        action = rng.random()
        if found is None or action < 0.3:
            cur.execute(
                "INSERT IGNORE INTO by_uuid VALUES (%s, %s, %s)",
                (random_uuid(rng), self.next, f"10.{self.next % 256}.0.0"),
            )
        elif action < 0.6:
            cur.execute("UPDATE by_uuid SET n = n + 1, ip = NULL WHERE id = %s", found)
        elif action < 0.8:
            cur.execute("DELETE FROM by_uuid WHERE id = %s", found)
        else:
            cur.execute(
                "UPDATE IGNORE by_uuid SET id = %s WHERE id = %s", (random_uuid(rng), *found)
            )


#: The Iceberg type of every all_types column (docs/types.md, Iceberg column).
ALL_TYPES_ICEBERG = {
    "id": "int",
    "t_tiny": "int",
    "t_tiny_u": "int",
    "t_small": "int",
    "t_small_u": "int",
    "t_medium": "int",
    "t_medium_u": "int",
    "t_int": "int",
    "t_int_u": "long",
    "t_big": "long",
    "t_big_u": "decimal(20, 0)",
    "t_year": "int",
    "t_dec": "decimal(12, 4)",
    "t_dec_wide": "string",
    "t_float": "float",
    "t_double": "double",
    "t_bool": "boolean",
    "t_bit1": "boolean",
    "t_bit": "long",
    "t_char": "string",
    "t_varchar": "string",
    "t_text": "string",
    "t_enum": "string",
    "t_set": "string",
    "t_json": "string",
    "t_binary": "binary",
    "t_varbinary": "binary",
    "t_blob": "binary",
    "t_date": "date",
    "t_datetime": "timestamp",
    "t_timestamp": "timestamptz",
    "t_time": "long",
    "t_inet6": "string",
    "t_uuid": "string",
}


def _verify_all(config_path: Path, tables: list[str]) -> None:
    """Every table equals its source: through the manifest, through pyiceberg (catalog) and
    through DuckDB's ``iceberg_scan`` (the metadata file ``current.json`` names)."""
    assert_readers_equal_source(load_config(config_path), tables)


def snapshots_per_version(config_path: Path, tables: list[str]) -> None:
    """One Iceberg snapshot per published version, each run's at most once."""
    config = load_config(config_path)
    for name in tables:
        snapshots = list(open_catalog(config).load_table(name).snapshots())
        versions = [s.summary["tidemark.version"] for s in snapshots if s.summary]
        runs = [s.summary["tidemark.run-id"] for s in snapshots if s.summary]
        assert len(versions) == len(snapshots) and len(set(versions)) == len(versions) == len(
            set(runs)
        )
        assert versions[-1] == str(read_manifest(table_dir(config, name))["version"])


def load_tables(
    mariadb: LocalMariaDB, db: str, *, orders: int, typed_rows: int, seed: int
) -> list[str]:
    """The shop tables (``orders`` orders) and ``all_types`` (ids 1 to ``typed_rows - 1``,
    random edge values from ``seed``) and ``by_uuid`` (as many rows) in ``db``; returns their
    names."""
    root = connect("127.0.0.1", mariadb.port, "root", "")
    try:
        load_shop(root, orders, db=db)
        with root.cursor() as cur:
            cur.execute(ALL_TYPES.format(db=db))
            cur.execute("SET time_zone = '+00:00', sql_mode = ''")
            rng = random.Random(seed)
            cur.executemany(
                f"INSERT INTO {db}.all_types ({_COLUMNS}) VALUES ({', '.join(['%s'] * 34)})",
                [type_row(i, rng) for i in range(1, typed_rows)],
            )
            cur.execute(BY_UUID.format(db=db))
            cur.executemany(
                f"INSERT INTO {db}.by_uuid VALUES (%s, %s, %s)",
                [(random_uuid(rng), i, f"10.0.{i % 256}.0") for i in range(1, typed_rows)],
            )
    finally:
        root.close()
    return [f"{db}.{t}" for t in (*SHOP_TABLES, "all_types", "by_uuid")]


def run_under_writers(
    mariadb: LocalMariaDB, db: str, *, typed_rows: int, pause: float, run: Callable[[], None]
) -> None:
    """Call ``run`` while two writers change every table of ``db``; check they did, during it.

    ``run`` starts once the shop writer is writing: an incremental run in a process that has run
    before takes a fraction of a second, less than the writer's connection and first statements
    (15 changes in all were seen), so what counts is the changes made while ``run`` ran."""
    shop_writer = Writer("127.0.0.1", mariadb.port, "root", "", db=db, pause=pause).start()
    types_writer = TypesWriter(mariadb, db, typed_rows)
    types_writer.start()
    deadline = time.monotonic() + 30
    while shop_writer.changes < 5 and shop_writer.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    before = shop_writer.changes
    try:
        run()
    finally:
        during = shop_writer.changes - before
        shop_writer.stop()
        types_writer.stop_event.set()
        types_writer.join(30)
    assert types_writer.error is None, types_writer.error
    assert before >= 5, "the writer must be writing before the run starts"
    assert during >= 5, f"the writer must have changed the tables during the run ({during} changes)"


def test_small_tables_read_by_the_driver_under_concurrent_writes_equal_source(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tables of one chunk and few rows are read by the driver (`pipeline.local_read`), not
    Spark: the same watermarks, so the same promise."""
    db = "cons_small"
    tables = load_tables(mariadb, db, orders=2_000, typed_rows=1500, seed=7)
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name="cons_small",
            defaults={"chunk_size": 50_000, "read_margin_seconds": 0.05},
        ),
    )
    config = load_config(config_path)

    def snapshot() -> None:
        with caplog.at_level(logging.INFO, logger="orchestrator.pipeline.read.local"):
            assert (
                run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
            )

    run_under_writers(mariadb, db, typed_rows=1500, pause=0.001, run=snapshot)
    assert any("small table(s) in the driver" in r.getMessage() for r in caplog.records)
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    _verify_all(config_path, tables)


def test_snapshot_under_concurrent_writes_equals_source(
    mariadb: LocalMariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = "cons_shop"
    tables = load_tables(mariadb, db, orders=12_000, typed_rows=1500, seed=5)
    config_path = write_config(
        tmp_path / "p.yaml",
        pipeline_config(
            tmp_path,
            mariadb,
            [{"name": t} for t in tables],
            name="cons",
            defaults={"chunk_size": 700, "batch_chunks": 3, "read_margin_seconds": 0.05},
        ),
    )
    config = load_config(config_path)

    def snapshot() -> None:
        assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0

    run_under_writers(mariadb, db, typed_rows=1500, pause=0.001, run=snapshot)
    # One more run applies what was written after H; then the lake equals the quiet source.
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    _verify_all(config_path, tables)
    # More changes, then an incremental run: Iceberg overwrites the rewritten files only.
    run_under_writers(mariadb, db, typed_rows=1500 + 10_000, pause=0.002, run=lambda: time.sleep(3))
    assert run_command(config, tables=[], snapshot=False, chunk_size=None, progress=False) == 0
    _verify_all(config_path, tables)
    snapshots_per_version(config_path, tables)
    rereads = [r.getMessage() for r in caplog.records if "re-read" in r.getMessage()]
    assert not rereads, "the system-versioned by_uuid too is applied, not re-read"
