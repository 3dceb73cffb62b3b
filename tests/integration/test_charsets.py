"""Text in every non-Unicode character set the server has, changed through the binlog, published
as the source shows it (`orchestrator.schema.charsets`).

A snapshot reads text through the server, which converts it with its own tables; the binlog
holds the stored bytes. Decoded with Python's codecs they differed for 14 of the server's sets
(euckr's Hangul beyond KS X 1001, sjis' and ujis' fullwidth backslash, greek's 0xA1...), and
7 sets had no codec at all. Here one column per set takes every string of two bytes the set
stores, and every three-byte string after ujis' and eucjpms' lead byte 0x8F, inserted after the
snapshot, so every value reaches the lake through the binlog. Real MariaDB."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from orchestrator.app.demo.localdb import LocalMariaDB
from orchestrator.pipeline.capture import passes
from orchestrator.schema import charsets
from tests.conftest import assert_lake_equals_source, load_pipeline
from tests.integration.conftest import fresh_database, run_plain

pytestmark = pytest.mark.integration

DB = "tm_charsets"


def _sets(server: LocalMariaDB) -> list[str]:
    rows = server.execute(
        "SELECT CHARACTER_SET_NAME FROM information_schema.CHARACTER_SETS"
        " WHERE CHARACTER_SET_NAME NOT LIKE 'utf%' AND CHARACTER_SET_NAME NOT IN ('ucs2', 'binary')"
        " ORDER BY 1"
    )
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize("pool", [False, True], ids=["in-process", "pool-on"])
def test_every_string_of_every_set_reaches_the_lake_as_the_source_shows_it(
    mariadb: LocalMariaDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: bool
) -> None:
    """``pool-on``: the capture decodes in worker processes whatever its size; a table with text
    in such a set is decoded by the capture itself, which asked the server."""
    if pool:
        monkeypatch.setattr(
            passes, "capture_changes", functools.partial(passes.capture_changes, pool_bytes=0)
        )
    sets = _sets(mariadb)
    assert {"latin1", "ascii", "sjis", "euckr", "ujis", "greek", "swe7"} <= set(sets)
    fresh_database(mariadb, DB)
    columns = ", ".join(f"c_{s} VARCHAR(4) CHARACTER SET {s}" for s in sets)
    mariadb.execute(
        f"CREATE TABLE t (id INT PRIMARY KEY, {columns})",
        "INSERT INTO t (id) VALUES (-1)",
        database=DB,
    )
    config = load_pipeline(tmp_path, mariadb, [{"name": f"{DB}.t"}], name="charsets")
    run_plain(config)

    def insert(ids: str, raw: str) -> str:
        values = ", ".join(f"CONVERT({raw} USING {s})" for s in sets)
        # IGNORE: a string a set does not store is stored as the server makes it (``?``)
        return f"INSERT IGNORE INTO t SELECT {ids}, {values} FROM seq_0_to_65535"

    mariadb.execute(
        insert("seq", "UNHEX(LPAD(HEX(seq), 4, '0'))"),  # every two bytes
        insert("65536 + seq", "UNHEX(CONCAT('8F', LPAD(HEX(seq), 4, '0')))")
        + " WHERE seq DIV 256 BETWEEN 161 AND 254 AND seq % 256 BETWEEN 161 AND 254",
        database=DB,
    )
    run_plain(config)
    assert charsets.missing(sets) == set(), "each set was read from the server"
    assert_lake_equals_source(config, mariadb, [f"{DB}.t"])
