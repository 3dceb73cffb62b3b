"""Key types whose bounds cannot be read back exactly are refused as chunk keys, naming the
column and a way out (found by a review: ranges of them missed rows, or an index walk looped)."""

from __future__ import annotations

import re

import pytest

from orchestrator.config import TableConfig
from orchestrator.errors import SourceNotReady
from orchestrator.pipeline.plan.keys import choose_chunk_key
from orchestrator.schema.tables import ColumnInfo, TableInfo


def table(key: ColumnInfo) -> TableInfo:
    return TableInfo("d", "t", (key, ColumnInfo("v", "int", "int(11)", True)), (key.name,), (), 0)


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        (ColumnInfo("k", "float", "float", False), "FLOAT values print rounded"),
        (ColumnInfo("k", "year", "year(2)", False), "YEAR(2) reads as two digits"),
    ],
)
def test_an_inexact_key_type_is_refused(column: ColumnInfo, reason: str) -> None:
    with pytest.raises(
        SourceNotReady,
        match=re.escape(f"table `d.t`: chunk-key column `k` cannot be chunked: {reason}"),
    ):
        choose_chunk_key(TableConfig(name="d.t", chunk_size=1000, batch_chunks=4), table(column))


@pytest.mark.parametrize(
    "column",
    [
        ColumnInfo("k", "double", "double", False),
        ColumnInfo("k", "year", "year(4)", False),
        ColumnInfo("k", "int", "int(11)", False),
    ],
)
def test_exact_key_types_are_chunked(column: ColumnInfo) -> None:
    assert choose_chunk_key(
        TableConfig(name="d.t", chunk_size=1000, batch_chunks=4), table(column)
    ) == ("k",)


@pytest.mark.parametrize(
    ("zone", "refused"),
    [
        ("+00:00", False),
        ("-05:30", False),
        ("UTC", False),
        ("Asia/Tokyo", False),
        ("Europe/Berlin", True),
        ("America/New_York", True),
        ("SYSTEM", True),
        ("Mars/Base", True),
    ],
)
def test_a_timestamp_key_is_refused_where_clocks_go_back(zone: str, refused: bool) -> None:
    """A review lost rows of a TIMESTAMP key under Europe/Berlin: bounds are local times, and one
    in the hour that repeats in autumn names two instants. SYSTEM and unknown names may do so."""
    column = ColumnInfo("k", "timestamp", "timestamp", False)
    config = TableConfig(name="d.t", chunk_size=1000, batch_chunks=4)
    if not refused:
        assert choose_chunk_key(config, table(column), zone) == ("k",)
        return
    with pytest.raises(
        SourceNotReady, match=re.escape(f"source.time_zone '{zone}' sets clocks back")
    ) as caught:
        choose_chunk_key(config, table(column), zone)
    assert "set source.time_zone to an offset such as +00:00" in str(caught.value)
    assert choose_chunk_key(
        config, table(ColumnInfo("k", "datetime", "datetime", False)), zone
    ) == ("k",)
