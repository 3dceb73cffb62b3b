"""Values where the snapshot (Spark and the driver, through the server's conversions) and the
binlog decoder must agree and once did not (found by a review): dates the server kept under
ALLOW_INVALID_DATES roll over as its DATEDIFF counts them, dates in year 0 are NULL, a byte a
single-byte character set leaves undefined is ``?``, as the server gives it, and a FLOAT the
server stores as ``-0.0`` is ``0.0``, as it prints it. Before, the binlog's February 30 failed
the whole capture (every table, at every resume), a cp1250 0x81 did too, a year-0 date failed
its table at publish, and a FLOAT ``-0.0`` from the binlog was published with its sign.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.config import PipelineConfig
from orchestrator.lake.manifest import read_published
from orchestrator.pipeline.context import table_dir
from tests.conftest import assert_lake_equals_source, fresh_database
from tests.integration.conftest import both_readers, run_plain

pytestmark = pytest.mark.integration

DB = "value_edges"
ROWS = (
    "('2020-02-30', '2020-02-30 12:00:00.5', x'61816298')",
    "('0000-01-01', '0000-01-01 00:00:00', 'plain')",
    "('2020-04-31', '2020-04-31 23:59:59', NULL)",
    "('2024-02-29', '1970-01-01 00:00:00', x'8a')",
)
EXPECTED = [
    (dt.date(2020, 3, 1), dt.datetime(2020, 3, 1, 12, 0, 0, 500000), "a?b?"),
    (None, None, "plain"),
    (dt.date(2020, 5, 1), dt.datetime(2020, 5, 1, 23, 59, 59), None),
    (dt.date(2024, 2, 29), dt.datetime(1970, 1, 1), "Š"),
]


def both_tables(mariadb: LocalMariaDB, db: str, columns: str, rows: str) -> None:
    """Database ``db`` made anew with tables ``spark`` and ``driver`` (`both_readers`), each of
    ``columns`` and holding ``rows`` (an INSERT's VALUES)."""
    fresh_database(mariadb, db)
    for table in ("spark", "driver"):
        mariadb.execute(
            f"CREATE TABLE {table} ({columns})", f"INSERT INTO {table} VALUES {rows}", database=db
        )


def published(
    config: PipelineConfig, table: str, *columns: str, key: str = "id"
) -> dict[Any, tuple[Any, ...]]:
    """``{key: (columns...)}`` of the table's current version."""
    rows = read_published(table_dir(config, table)).to_pylist()
    found = {r[key]: tuple(r[c] for c in columns) for r in rows}
    assert len(found) == len(rows), f"{table}: one row per {key}"
    return found


def test_the_snapshot_and_the_binlog_agree_on_edge_values(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    fresh_database(mariadb, DB)
    conn = mariadb.connect(database=DB)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
            for table in ("spark", "driver"):
                cur.execute(
                    f"CREATE TABLE {table} (id INT PRIMARY KEY, d DATE, dt DATETIME(6), "
                    "c VARCHAR(10) CHARACTER SET cp1250)"
                )
                cur.execute(
                    f"INSERT INTO {table} (d, dt, c, id) VALUES "
                    + ", ".join(f"{row[:-1]}, {n})" for n, row in enumerate(ROWS, 1))
                )
        config = both_readers(tmp_path, mariadb, DB)
        run_plain(config)
        snapshot = dict(enumerate(EXPECTED, 1))
        assert published(config, f"{DB}.spark", "d", "dt", "c") == snapshot
        assert published(config, f"{DB}.driver", "d", "dt", "c") == snapshot
        with conn.cursor() as cur:  # the same values again, through the binlog
            for table in ("spark", "driver"):
                cur.execute(
                    f"INSERT INTO {table} (d, dt, c, id) VALUES "
                    + ", ".join(f"{row[:-1]}, {n + 10})" for n, row in enumerate(ROWS, 1))
                )
                cur.execute(
                    f"UPDATE {table} SET d = '2021-02-29', dt = '2021-02-29 01:02:03', c = x'81'"
                    " WHERE id = 4"
                )
    finally:
        conn.close()
    run_plain(config)
    expected = {
        **snapshot,
        **{n + 10: row for n, row in snapshot.items()},
        4: (dt.date(2021, 3, 1), dt.datetime(2021, 3, 1, 1, 2, 3), "?"),
    }
    assert published(config, f"{DB}.spark", "d", "dt", "c") == expected
    assert published(config, f"{DB}.driver", "d", "dt", "c") == expected


def test_char_values_are_unpadded_under_pad_char_to_full_length(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """A server in PAD_CHAR_TO_FULL_LENGTH mode returns CHAR values padded; the binlog holds them
    without the pad, as every other mode returns them: the lake has them unpadded either way."""
    db = "char_pad"
    both_tables(
        mariadb,
        db,
        "id INT PRIMARY KEY, c CHAR(5), u CHAR(4) CHARACTER SET ucs2",
        "(1, 'a', 'é'), (2, '', ''), (3, ' b', NULL), (4, 'abcde', 'wxyz')",
    )
    (mode,) = mariadb.execute("SELECT @@GLOBAL.sql_mode")[0]
    mariadb.execute("SET GLOBAL sql_mode = CONCAT(@@GLOBAL.sql_mode, ',PAD_CHAR_TO_FULL_LENGTH')")
    try:
        config = both_readers(tmp_path, mariadb, db)
        run_plain(config)
        mariadb.execute(
            "UPDATE spark SET c = 'x' WHERE id = 4",
            "UPDATE driver SET c = 'x' WHERE id = 4",
            database=db,
        )
        run_plain(config)
    finally:
        mariadb.execute(f"SET GLOBAL sql_mode = '{mode}'")
    expected = {1: ("a", "é"), 2: ("", ""), 3: (" b", None), 4: ("x", "wxyz")}
    for table in ("spark", "driver"):
        assert published(config, f"{db}.{table}", "c", "u") == expected, table


def test_a_two_digit_year_is_its_year(mariadb: LocalMariaDB, tmp_path: Path, spark: object) -> None:
    """YEAR(2), which MariaDB still creates, reads as two digits (70 for 1970); the binlog holds
    the year: the lake has the year on both paths."""
    db = "year_two"
    both_tables(
        mariadb,
        db,
        "id INT PRIMARY KEY, y YEAR(2)",
        "(1, 1970), (2, 2069), (3, 2000), (4, 1999), (5, NULL)",
    )
    config = both_readers(tmp_path, mariadb, db)
    run_plain(config)
    mariadb.execute(
        "INSERT INTO spark VALUES (6, 1985)", "INSERT INTO driver VALUES (6, 1985)", database=db
    )
    run_plain(config)
    expected = {1: (1970,), 2: (2069,), 3: (2000,), 4: (1999,), 5: (None,), 6: (1985,)}
    for table in ("spark", "driver"):
        assert published(config, f"{db}.{table}", "y") == expected, table


def _signs(config: PipelineConfig, table: str) -> dict[Any, tuple[float | None, ...]]:
    """``{id: (sign of f, sign of d)}``: 1.0 or -1.0 (``-0.0`` has -1.0), None for NULL."""
    return {
        key: tuple(None if v is None else math.copysign(1.0, v) for v in values)
        for key, values in published(config, table, "f", "d").items()
    }


def test_a_negative_zero_is_zero_on_both_paths(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """A FLOAT or DOUBLE the server stores as ``-0.0`` reads as ``0`` (the text a snapshot reads
    by), while the binlog holds its bits, sign included: the lake has ``0.0`` either way, so a
    row's value does not depend on the path that brought it (docs/types.md)."""
    db = "neg_zero"
    negative = "-1e-30 * 1e-30, -1e-300 * 1e-300"  # below the smallest: stored as -0.0
    both_tables(
        mariadb,
        db,
        "id INT PRIMARY KEY, f FLOAT, d DOUBLE",
        f"(1, {negative}), (2, -0.0, -0.0), (3, -1.5, NULL), (4, 0.0, 2.5)",
    )
    config = both_readers(tmp_path, mariadb, db)
    run_plain(config)
    for table in ("spark", "driver"):
        mariadb.execute(
            f"INSERT INTO {table} VALUES (11, {negative}), (12, -0.0, -0.0)",
            f"UPDATE {table} SET f = -1e-30 * 1e-30 WHERE id = 3",
            f"UPDATE {table} SET d = -1e-300 * 1e-300 WHERE id = 4",
            f"UPDATE {table} SET f = f WHERE id = 1",  # no change: not logged
            f"UPDATE {table} SET d = 7 WHERE id = 2",
            database=db,
        )
    run_plain(config)
    expected = {
        1: (1.0, 1.0),
        2: (1.0, 1.0),
        3: (1.0, None),
        4: (1.0, 1.0),
        11: (1.0, 1.0),
        12: (1.0, 1.0),
    }
    for table in ("spark", "driver"):
        assert _signs(config, f"{db}.{table}") == expected, table


def test_a_float_or_double_with_decimals_is_its_stored_value(
    mariadb: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    """A DOUBLE(M, D) or FLOAT(M, D) stores the value rounded by the server's arithmetic, which
    need not be the double nearest the D-digit decimal it prints (4/3 in a DOUBLE(20, 10) is
    stored as 1.3333333330000001, printed as 1.3333333330). The snapshot reads the stored value
    (its columns come through a derived table, which prints every digit) and the binlog holds it:
    the lake has it on both paths, and the verify oracle compares it with the stored value too
    (before, it read the printed one and `tidemark verify` called such a table different)."""
    db = "double_decimals"
    values = ", ".join(f"({n}, {n} / 3.0 + 1e-11, {n} / 7.0 + 0.0005)" for n in range(1, 40))
    both_tables(mariadb, db, "id INT PRIMARY KEY, d DOUBLE(20,10), f FLOAT(7,3)", values)
    config = both_readers(tmp_path, mariadb, db)
    run_plain(config)
    for table in ("spark", "driver"):  # the same values by the binlog
        mariadb.execute(
            f"INSERT INTO {table} SELECT id + 100, d, f FROM {table} WHERE id < 40", database=db
        )
    run_plain(config)
    printed = dict(mariadb.execute("SELECT id, d FROM spark WHERE id < 40", database=db))
    stored = dict(
        mariadb.execute("SELECT id, CAST(d AS DOUBLE) FROM spark WHERE id < 40", database=db)
    )
    assert printed[4] != stored[4] == 1.3333333330000001  # the case is here
    for table in ("spark", "driver"):
        found = published(config, f"{db}.{table}", "d")
        assert {k: v for (k, v) in found.items() if k < 40} == {k: (v,) for k, v in stored.items()}
        assert {k - 100: v for (k, v) in found.items() if k > 100} == {
            k: (v,) for k, v in stored.items()
        }
    assert_lake_equals_source(config, mariadb, [f"{db}.spark", f"{db}.driver"])
