"""Table patterns without a server (issue 16): the config's globs and excludes, expanding them over
a list of tables, resolving one table's settings, selecting tables, dropped tables, and packing
small tables into read batches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orchestrator.config import Defaults, parse_config
from orchestrator.config.patterns import dropped, expand, glob_matches
from orchestrator.errors import ConfigError
from orchestrator.pipeline.plan.batches import PACK_TABLES, Draft, assign_batches
from orchestrator.state.store import ChunkRecord, PlannedTable

SOURCE = {"host": "h", "user": "u", "server_id": 1}
SOURCE_TABLES = [
    "crm.accounts",
    "crm.big",
    "crm.tmp_1",
    "crm.tmp_2",
    "crm2.x",
    "shop.orders",
    "mysql.user",
    "sys.sys_config",
]


def config(tables: list[dict[str, Any]]) -> Any:
    return parse_config(
        {
            "pipeline": "p",
            "source": SOURCE,
            "output": {"path": "/l"},
            "state": {"url": "sqlite://"},
            "tables": tables,
        },
        origin="p.yaml",
        check_env=False,
    )


def problems(tables: list[dict[str, Any]]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config(tables)
    return caught.value.problems


@pytest.mark.parametrize(
    ("tables", "expected"),
    [
        (
            [{"name": "crm*"}],
            "p.yaml: tables[0].name: expected `database.table` or a glob over both",
        ),
        (
            [{"name": "crm.[a-"}],
            "p.yaml: tables[0].name: expected `database.table` or a glob over both",
        ),
        (
            [{"name": "crm.a/b*"}],
            "p.yaml: tables[0].name: expected `database.table` or a glob over both",
        ),
        (
            [{"name": "crm.orders", "exclude": ["crm.x"]}],
            "p.yaml: tables[0].exclude: exclude applies to a pattern entry only",
        ),
        (
            [{"name": "crm.*", "exclude": {"a": 1}}],
            "p.yaml: tables[0].exclude: expected a glob or a list of globs",
        ),
        (
            [{"name": "crm.*", "exclude": ["crm.ok_*", "tmp"]}],
            "p.yaml: tables[0].exclude[1]: expected `database.table`",
        ),
        (
            [{"name": "crm.*"}, {"name": "crm.*"}],
            "p.yaml: tables[1].name: table crm.* is listed twice",
        ),
    ],
)
def test_bad_patterns_are_refused_naming_the_key(
    tables: list[dict[str, Any]], expected: str
) -> None:
    found = problems(tables)
    assert any(p.startswith(expected) for p in found), found


def test_a_pattern_with_excludes_and_an_override() -> None:
    c = config(
        [
            {"name": "crm.*", "exclude": "crm.tmp_*", "where": "id > 0", "chunk_size": 7},
            {"name": "*.orders"},
            {"name": "crm.big", "chunk_key": ["id"]},
        ]
    )
    assert c.has_patterns
    found = expand(c.tables, SOURCE_TABLES)
    assert found.names == ["crm.accounts", "shop.orders", "crm.big"]
    assert [(m.pattern, m.tables, m.excluded, m.overridden) for m in found.patterns] == [
        ("crm.*", ("crm.accounts",), ("crm.tmp_1", "crm.tmp_2"), ("crm.big",)),
        ("*.orders", ("shop.orders",), (), ()),
    ]
    assert [found.entry_index(n) for n in found.names] == [0, 1, 2]
    # one table's settings, without the source: the override wins, else the first pattern
    assert c.table("crm.big").chunk_key == ("id",) and c.table("crm.big").where is None
    assert (c.table("crm.accounts").where, c.table("crm.accounts").chunk_size) == ("id > 0", 7)
    assert c.table("crm.accounts").exclude == () and c.table_where("crm.tmp_1") is None
    with pytest.raises(ConfigError, match=r"crm\.tmp_1 not in pipeline"):
        c.select_tables(["crm.tmp_1"])
    # a request may name a pattern (all it matched) or tables; anything else is refused
    assert [t.name for t in found.select(["crm.*"])] == ["crm.accounts"]
    assert [t.name for t in found.select(["shop.orders", "crm.big"])] == ["shop.orders", "crm.big"]
    with pytest.raises(ConfigError, match=r"crm\.tmp_1 not in the pipeline"):
        found.select(["crm.tmp_1"])


def test_globs_match_part_by_part_and_skip_the_servers_own_schemas() -> None:
    assert glob_matches("*.*", "crm.accounts") and not glob_matches("*.*", "mysql.user")
    assert glob_matches("mysql.*", "mysql.user")  # named on purpose
    assert not glob_matches("crm.*", "crm2.x") and glob_matches("crm?.*", "crm2.x")
    assert glob_matches("crm.[a-c]*", "crm.big") and not glob_matches("crm.[!a-c]*", "crm.big")
    assert not glob_matches("CRM.*", "crm.accounts") and glob_matches(
        "CRM.*", "crm.accounts", fold=True
    )
    found = expand(config([{"name": "*.*"}]).tables, SOURCE_TABLES)
    assert "mysql.user" not in found.names and "sys.sys_config" not in found.names


def test_dropped_tables_are_published_ones_a_pattern_no_longer_finds() -> None:
    c = config([{"name": "crm.*", "exclude": ["crm.tmp_*"]}, {"name": "shop.gone"}])
    found = expand(c.tables, ["crm.accounts"])
    published = ["crm.accounts", "crm.old", "crm.tmp_9", "shop.gone", "other.t"]
    # crm.tmp_9 is excluded (no longer configured, not dropped); shop.gone is an explicit entry
    # (preflight says it is missing); other.t no entry takes
    assert dropped(c.tables, found, published) == ["crm.old"]


def _draft(name: str, chunks: int, rows: int) -> Draft:
    chunk = ChunkRecord(
        "r", name, 0, -1, None, None, "", "pending", None, None, None, None, None, 0
    )
    plan = PlannedTable(
        name, "snapshot", "even", ["id"], {}, [replace(chunk, index=i) for i in range(chunks)]
    )
    return Draft(plan, rows, 4)


def test_small_tables_share_batches_up_to_a_count_and_a_row_budget() -> None:
    defaults = Defaults(chunk_size=1000, batch_chunks=4)  # a batch's budget: 4,000 rows
    drafts = [_draft(f"d.t{i:04d}", 1, 10) for i in range(PACK_TABLES + 3)]
    drafts += [_draft("d.big", 9, 9000), _draft("d.mid", 1, 3500), _draft("d.mid2", 1, 900)]
    batches = {p.table: [c.batch for c in p.chunks] for p in assign_batches(drafts, 0, defaults)}
    assert {batches[f"d.t{i:04d}"][0] for i in range(PACK_TABLES)} == {0}  # full at PACK_TABLES
    assert batches["d.big"] == [1, 1, 1, 1, 2, 2, 2, 2, 3]  # its own batches, 4 chunks each
    assert {batches[f"d.t{i:04d}"][0] for i in range(PACK_TABLES, PACK_TABLES + 3)} == {4}
    assert batches["d.mid"] == [4] and batches["d.mid2"] == [5]  # 30 + 3500 + 900 rows > 4000
