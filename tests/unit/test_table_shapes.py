"""A run's table records hold the planned shape as JSON text (`table_info_text`), decoded once
per process into a shared, immutable `TableInfo` (`table_info_of`); records written before hold
the mapping, which still reads."""

from __future__ import annotations

import json

from orchestrator.pipeline.context import table_info
from orchestrator.schema.tables import (
    ColumnInfo,
    TableInfo,
    table_info_of,
    table_info_text,
    table_info_to_json,
)
from orchestrator.state.store import RunTableRecord

SHAPE = TableInfo(
    "shop",
    "orders",
    (
        ColumnInfo("id", "bigint", "bigint(20)", False, 19, 0, in_key=True),
        ColumnInfo("note", "varchar", "varchar(20)", True, charset="utf8mb4", collation="x"),
        ColumnInfo("p", "point", "point", True, srid=4326),
    ),
    ("id",),
    (("id",),),
    1234,
    "InnoDB",
    versioned=True,
    kind="SYSTEM VERSIONED",
)


def record(stored: object) -> RunTableRecord:
    info = json.loads(json.dumps({"table_info": stored, "from_position": None}))
    return RunTableRecord(
        "r", "shop.orders", "incremental", "planned", None, ["id"], info, None, None
    )


def test_the_text_round_trips_every_field_and_is_decoded_once() -> None:
    text = json.dumps(table_info_to_json(SHAPE))  # as another process wrote it
    first, second = table_info(record(text)), table_info(record(text))
    assert first == SHAPE
    assert second is first  # the same immutable object: the second step decoded nothing


def test_the_writing_process_decodes_nothing() -> None:
    text = table_info_text(SHAPE)
    assert json.loads(text) == table_info_to_json(SHAPE)
    assert table_info(record(text)) is SHAPE


def test_a_record_written_before_holds_the_mapping() -> None:
    assert table_info(record(table_info_to_json(SHAPE))) == SHAPE
    assert table_info_of(table_info_to_json(SHAPE)) == SHAPE
