"""orchestrator.pipeline.plan.chunks without a server: key choice, refusals, the outputs."""

from __future__ import annotations

import json

import pytest

from chunking import Chunk, KeyRange, TablePlan
from orchestrator.app.plan import plan_document, render_plans
from orchestrator.config import TableConfig
from orchestrator.errors import ConfigError, SourceNotReady
from orchestrator.pipeline.plan.chunks import check_escaping, describe_decision, read_by
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.pipeline.read.local import LOCAL_ROWS
from orchestrator.schema.tables import ColumnInfo, TableInfo


def col(name: str, data_type: str = "int", nullable: bool = False) -> ColumnInfo:
    return ColumnInfo(name, data_type, data_type, nullable)


def table(
    primary: tuple[str, ...] = (),
    uniques: tuple[tuple[str, ...], ...] = (),
    columns: tuple[ColumnInfo, ...] | None = None,
) -> TableInfo:
    columns = columns or (col("id"), col("a"), col("b", "varchar"), col("c"), col("e", "enum"))
    return TableInfo("shop", "t", columns, primary, uniques, 100)


def config(chunk_key: tuple[str, ...] | None = None, where: str | None = None) -> TableConfig:
    return TableConfig("shop.t", chunk_size=10, batch_chunks=2, chunk_key=chunk_key, where=where)


def test_primary_key_by_default() -> None:
    assert choose_chunk_key(config(), table(("id",), (("id",), ("c",)))) == ("id",)


def test_configured_unique_not_null_key() -> None:
    info = table(("id",), (("id",), ("a", "b")))
    assert choose_chunk_key(config(("A", "B")), info) == (
        "a",
        "b",
    )  # names as the table spells them


def test_configured_key_without_a_primary_key() -> None:
    assert choose_chunk_key(config(("c",)), table((), (("c",),))) == ("c",)


def test_no_key_at_all_is_no_chunk_key() -> None:
    """A table without a primary or unique NOT NULL key is published as the multiset of its rows
    (`orchestrator.pipeline.keyless`), not refused."""
    assert choose_chunk_key(config(), table()) == ()


@pytest.mark.parametrize(
    ("chunk_key", "info", "error", "says"),
    [
        (
            None,
            table((), (("a", "b"),)),
            ConfigError,
            ("has no primary key", "set chunk_key: [a, b]"),
        ),
        (
            ("c",),
            table(("id",), (("id",),)),
            ConfigError,
            ("not the primary key or a unique NOT NULL key", "use one of: [id]"),
        ),
        (("b", "a"), table((), (("a", "b"),)), ConfigError, ("index order: chunk_key: [a, b]",)),
        (("nope",), table(("id",)), ConfigError, ("nope do not exist",)),
        (
            None,
            table(("e",), (("e",), ("c",))),
            SourceNotReady,
            ("ENUM sorts by member number", "try chunk_key: [c]"),
        ),
        (
            ("e",),
            table(("id",), (("id",), ("e",))),
            ConfigError,
            ("chunk-key column `e` cannot be chunked",),
        ),
        (
            None,
            table(
                ("n",),
                (("n",),),
                columns=(ColumnInfo("n", "char", "char(4)", False, collation="utf8mb4_nopad_bin"),),
            ),
            SourceNotReady,
            ("NO PAD collation utf8mb4_nopad_bin", "use VARCHAR"),
        ),
    ],
)
def test_refusals_say_how_to_fix(
    chunk_key: tuple[str, ...] | None,
    info: TableInfo,
    error: type[Exception],
    says: tuple[str, ...],
) -> None:
    with pytest.raises(error) as caught:
        choose_chunk_key(config(chunk_key), info)
    message = str(caught.value)
    assert "shop.t" in message
    for part in says:
        assert part in message


def test_a_session_with_literal_backslashes_is_refused() -> None:
    """Tidemark's sessions set SESSION_SQL_MODE; one where that did not hold is refused."""
    check_escaping(lambda sql: [("ALLOW_INVALID_DATES",)])
    with pytest.raises(SourceNotReady, match="NO_BACKSLASH_ESCAPES although Tidemark set it"):
        check_escaping(lambda sql: [("ANSI,NO_BACKSLASH_ESCAPES",)])


def sample_plan() -> TablePlan:
    chunks = (
        Chunk(0, KeyRange.of(None, (10,)), 9),
        Chunk(1, KeyRange.through((10,), (18446744073709551615,)), 9),
    )
    stats = {
        "min": [1],
        "max": [18446744073709551615],
        "rows": 18,
        "rows_exact": True,
        "factor": None,
        "chunks": 2,
        "queries": 6,
        "reason": "bigint key",
        "strategy": "uneven",
    }
    return TablePlan("shop.t", "uneven", ("id",), chunks, stats)


def test_plan_document_shape() -> None:
    info = table(("id",), columns=(col("id", "bigint"), col("a")))
    doc = json.loads(json.dumps(plan_document([(config(where="a > 'x'"), info, sample_plan())])))
    assert doc == {
        "tables": [
            {
                "table": "shop.t",
                "strategy": "uneven",
                "read_by": "spark",
                "chunk_key": ["id"],
                "reason": "bigint key",
                "chunks": [
                    {
                        "index": 0,
                        "where": "(`id` < 10) AND (a > 'x')",
                        "start": None,
                        "end": [10],
                        "end_inclusive": False,
                    },
                    {
                        "index": 1,
                        "where": "(`id` >= 10 AND `id` <= 18446744073709551615) AND (a > 'x')",
                        "start": [10],
                        "end": [18446744073709551615],
                        "end_inclusive": True,
                    },
                ],
            }
        ]
    }


def test_human_output_and_log_line() -> None:
    text = render_plans([sample_plan()])
    header, row = text.splitlines()
    assert header.split() == [
        "table",
        "strategy",
        "read",
        "by",
        "chunks",
        "rows",
        "chunk",
        "key",
        "key",
        "range",
    ]
    assert row.split() == [
        "shop.t",
        "uneven",
        "spark",
        "2",
        "18",
        "id",
        "1",
        "..",
        "18446744073709551615",
    ]
    line = describe_decision(sample_plan())
    assert line == (
        "table shop.t: strategy uneven, min 1, max 18446744073709551615, rows 18, "
        "distribution factor n/a, 2 chunks, 6 queries (bigint key)"
    )


def test_a_small_table_of_one_chunk_is_read_by_the_driver() -> None:
    small = TablePlan(
        "shop.s", "even", ("id",), (Chunk(0, KeyRange.all(), 40),), {"rows": 40, "rows_exact": True}
    )
    assert read_by(small) == "driver"
    assert (
        read_by(TablePlan("shop.s", "even", ("id",), small.chunks, {"rows": LOCAL_ROWS + 1}))
        == "spark"
    )
    assert render_plans([small]).splitlines()[1].split()[2] == "driver"


def test_empty_table_renders() -> None:
    plan = TablePlan(
        "shop.e", "empty", ("id",), (), {"min": None, "max": None, "rows": 0, "rows_exact": True}
    )
    assert "(empty)" in render_plans([plan])
