"""orchestrator.app.doctor without a server: the chunk-key check is the planner's own choice."""

from __future__ import annotations

import pytest

from orchestrator.app.doctor import chunk_key_check
from orchestrator.config import TableConfig
from orchestrator.errors import ConfigError, SourceNotReady
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.source.snapshot import SnapshotMethod

COLUMNS = (
    ColumnInfo("a", "int", "int(11)", False),
    ColumnInfo("b", "varchar", "varchar(10)", False),
    ColumnInfo("n", "int", "int(11)", True),
    ColumnInfo("e", "enum", "enum('x')", False),
)


def table(primary: tuple[str, ...] = (), uniques: tuple[tuple[str, ...], ...] = ()) -> TableInfo:
    return TableInfo("shop", "pairs", COLUMNS, primary, uniques, 10)


def config(chunk_key: tuple[str, ...] | None = None) -> TableConfig:
    return TableConfig("shop.pairs", chunk_size=10, batch_chunks=2, chunk_key=chunk_key)


PAIRS = table((), (("a", "b"),))

# chunk_key, table, passes, in the detail, the fix
CASES = [
    (("a", "b"), PAIRS, True, "(a, b) from tables[3].chunk_key, a unique NOT NULL key", ""),
    (("A", "B"), PAIRS, True, "(a, b) from tables[3].chunk_key", ""),
    (
        ("b", "a"),
        PAIRS,
        False,
        "must list the key's columns in index order: chunk_key: [a, b]",
        "change tables[3].chunk_key",
    ),
    (
        None,
        PAIRS,
        False,
        "has no primary key; set chunk_key: [a, b] for it",
        "set tables[3].chunk_key",
    ),
    (
        ("n",),
        PAIRS,
        False,
        "chunk_key [n] is not the primary key or a unique NOT NULL key",
        "change tables[3].chunk_key",
    ),
    (("zz",), PAIRS, False, "chunk_key column(s) zz do not exist", "change tables[3].chunk_key"),
    (None, table(("a",), (("a",),)), True, "primary key (a)", ""),
    (None, table(("e",), (("e",), ("a", "b"))), False, "ENUM sorts by member number", ""),
    (None, table(), True, "no unique NOT NULL key: published as the multiset of its rows", ""),
]


@pytest.mark.parametrize(("chunk_key", "info", "ok", "detail", "fix"), CASES)
def test_chunk_key_check(
    chunk_key: tuple[str, ...] | None, info: TableInfo, ok: bool, detail: str, fix: str
) -> None:
    check = chunk_key_check(config(chunk_key), 3, info)
    assert (check.name, check.ok, check.fix) == ("chunk key shop.pairs", ok, fix)
    assert detail in check.detail, check.detail


@pytest.mark.parametrize(("chunk_key", "info"), [(row[0], row[1]) for row in CASES])
def test_doctor_passes_exactly_what_the_planner_accepts(
    chunk_key: tuple[str, ...] | None, info: TableInfo
) -> None:
    try:
        choose_chunk_key(config(chunk_key), info)
        planner_accepts = True
    except (ConfigError, SourceNotReady):
        planner_accepts = False
    assert chunk_key_check(config(chunk_key), 0, info).ok is planner_accepts


@pytest.mark.parametrize(
    ("method", "says"),
    [
        ("snapshot", "consistent snapshot's binlog position"),
        ("quiet", "no change of it in a short window"),
        ("lock", "brief LOCK TABLES ... READ"),
    ],
)
def test_a_table_without_a_key_says_how_it_is_read(method: SnapshotMethod, says: str) -> None:
    check = chunk_key_check(config(), 3, table(), snapshot=lambda: method)
    assert check.ok and says in check.detail, check.detail
