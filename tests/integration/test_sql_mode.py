"""A source whose global ``sql_mode`` changes how SQL reads: every Tidemark session sets its own
(`chunking.mysql.SESSION_SQL_MODE`), so the plan's literals and bounds mean what they say.

Before: ``NO_BACKSLASH_ESCAPES`` was refused; ``EMPTY_STRING_IS_NULL`` turned a bound ``''``
into NULL; and a UNION turned a DATETIME key's invalid date (kept under
``ALLOW_INVALID_DATES``) into a zero date, so a table whose largest key was one was published
empty, with exit 0.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import GOOD_BINLOG, LocalMariaDB
from tests.conftest import HAVE_MARIADB, load_pipeline
from tests.integration.conftest import run_plain
from tests.integration.test_value_edges import published

pytestmark = pytest.mark.integration

HOSTILE = (
    "NO_BACKSLASH_ESCAPES,EMPTY_STRING_IS_NULL,ANSI_QUOTES,PIPES_AS_CONCAT,PAD_CHAR_TO_FULL_LENGTH"
)
TEXT_KEYS = ["", "a\\b", "it's", "\\", "z"]


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[LocalMariaDB]:
    if not HAVE_MARIADB:
        pytest.skip("mariadbd is not installed (Debian package mariadb-server)")
    server = LocalMariaDB.create({**GOOD_BINLOG, "sql-mode": HOSTILE}, base_dir=tmp_path)
    server.start()
    yield server
    server.destroy()


def fill(server: LocalMariaDB, rows: list[tuple[str, str]], first: int) -> None:
    """Rows of ``text_<reader>`` and ``dates_<reader>``, written with NO_BACKSLASH_ESCAPES (PyMySQL
    escapes parameters for it) and ALLOW_INVALID_DATES, and without EMPTY_STRING_IS_NULL."""
    conn = server.connect(database="modes")
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES,ALLOW_INVALID_DATES'")
            for reader in ("spark", "driver"):
                for n, (text, when) in enumerate(rows, first):
                    cur.execute(f"INSERT INTO text_{reader} (k, n) VALUES (%s, %s)", (text, n))
                    cur.execute(f"INSERT INTO dates_{reader} (k, n) VALUES (%s, %s)", (when, n))
    finally:
        conn.close()


def test_a_hostile_global_sql_mode_reads_exactly(
    hostile: LocalMariaDB, tmp_path: Path, spark: object
) -> None:
    hostile.execute("CREATE DATABASE modes")
    for reader in ("spark", "driver"):
        hostile.execute(
            f"CREATE TABLE text_{reader} (k VARCHAR(10) PRIMARY KEY, n INT, c CHAR(5) DEFAULT 'x')",
            f"CREATE TABLE dates_{reader} (k DATETIME PRIMARY KEY, n INT)",
            database="modes",
        )
    # the largest DATETIME key is a date only ALLOW_INVALID_DATES keeps
    fill(
        hostile,
        list(
            zip(
                TEXT_KEYS,
                [
                    "2020-01-01 00:00:00",
                    "2020-02-30 00:00:00",
                    "2020-03-02 00:00:00",
                    "2020-03-03 00:00:00",
                    "2020-04-31 10:00:00",
                ],
                strict=True,
            )
        ),
        1,
    )
    tables = [{"name": f"modes.{kind}_spark", "chunk_size": 1} for kind in ("text", "dates")]
    tables += [{"name": f"modes.{kind}_driver"} for kind in ("text", "dates")]
    config = load_pipeline(
        tmp_path, hostile, tables, name="modes", defaults={"read_margin_seconds": 0.0}
    )

    run_plain(config)
    texts = {key: (n, "x") for n, key in enumerate(TEXT_KEYS, 1)}
    dates = {
        dt.datetime(2020, 1, 1): (1,),
        dt.datetime(2020, 3, 1): (2,),
        dt.datetime(2020, 3, 2): (3,),
        dt.datetime(2020, 3, 3): (4,),
        dt.datetime(2020, 5, 1, 10): (5,),
    }
    for reader in ("spark", "driver"):
        assert published(config, f"modes.text_{reader}", "n", "c", key="k") == texts, reader
        assert published(config, f"modes.dates_{reader}", "n", key="k") == dates, reader

    fill(hostile, [("\\\\'", "2021-02-29 01:00:00"), ("zz", "2021-06-31 00:00:00")], 6)
    run_plain(config)
    texts |= {"\\\\'": (6, "x"), "zz": (7, "x")}
    dates |= {dt.datetime(2021, 3, 1, 1): (6,), dt.datetime(2021, 7, 1): (7,)}
    for reader in ("spark", "driver"):
        assert published(config, f"modes.text_{reader}", "n", "c", key="k") == texts, reader
        assert published(config, f"modes.dates_{reader}", "n", key="k") == dates, reader
