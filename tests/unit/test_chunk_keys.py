"""Key types whose bounds cannot be read back exactly are refused as chunk keys, naming the
column and a way out (found by a review: ranges of them missed rows, or an index walk looped)."""

from __future__ import annotations

import re

import pytest

from orchestrator.config import TableConfig
from orchestrator.errors import SourceNotReady
from orchestrator.schema.keys import choose_chunk_key
from orchestrator.schema.tables import ColumnInfo, TableInfo


def table(key: ColumnInfo) -> TableInfo:
    return TableInfo("d", "t", (key, ColumnInfo("v", "int", "int(11)", True)), (key.name,), (), 0)


@pytest.mark.parametrize(("column", "reason"), [
    (ColumnInfo("k", "float", "float", False), "FLOAT values print rounded"),
    (ColumnInfo("k", "year", "year(2)", False), "YEAR(2) reads as two digits"),
])
def test_an_inexact_key_type_is_refused(column: ColumnInfo, reason: str) -> None:
    with pytest.raises(SourceNotReady, match=re.escape(f"table `d.t`: chunk-key column `k` cannot be chunked: {reason}")):
        choose_chunk_key(TableConfig(name="d.t", chunk_size=1000, batch_chunks=4), table(column))


@pytest.mark.parametrize("column", [ColumnInfo("k", "double", "double", False),
                                    ColumnInfo("k", "year", "year(4)", False),
                                    ColumnInfo("k", "int", "int(11)", False)])
def test_exact_key_types_are_chunked(column: ColumnInfo) -> None:
    assert choose_chunk_key(TableConfig(name="d.t", chunk_size=1000, batch_chunks=4), table(column)) == ("k",)
