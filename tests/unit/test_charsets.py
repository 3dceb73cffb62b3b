"""`orchestrator.schema.charsets` without a server: which sets are asked about, and a set it cannot
build failing by name wherever it is used. Every set's decoding against the server itself:
integration/test_charsets.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.schema import charsets
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import column_converter


class FourBytes:
    """A server whose set ``fourbytes`` has characters of four bytes (as MySQL 8's gb18030)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def query(self, sql: str, params: Sequence[Any] | None = None) -> list[Any]:
        self.asked.append(sql)
        assert "information_schema.CHARACTER_SETS" in sql and params == ("fourbytes",)
        return [(4,)]


def test_a_set_it_cannot_read_fails_by_name_and_is_asked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(charsets, "_failed", {})  # what this test learns stays in it
    server = FourBytes()
    why = charsets.load(server, ["FourBytes", "utf8mb4", "latin1"])
    assert list(why) == ["fourbytes"] and "characters of 4 bytes" in why["fourbytes"]
    assert charsets.load(server, ["fourbytes"]) == why  # known: not asked again
    assert len(server.asked) == 1
    with pytest.raises(charsets.CharsetError, match="characters of 4 bytes"):
        column_converter(ColumnInfo("c", "varchar", "varchar(5)", True, charset="fourbytes"))


def test_only_the_text_of_non_unicode_sets_is_asked_about() -> None:
    def column(name: str, data_type: str, charset: str | None) -> ColumnInfo:
        return ColumnInfo(name, data_type, data_type, True, charset=charset)

    info = TableInfo(
        "d",
        "t",
        (
            column("a", "varchar", "sjis"),
            column("b", "text", "utf8mb4"),
            column("c", "char", "latin1"),  # built in
            column("e", "enum", "greek"),  # its labels are the column's definition
            column("j", "json", "ujis"),
            column("v", "varbinary", None),
        ),
        (),
        (),
        0,
    )
    assert charsets.used_by([info]) == {"sjis", "ujis"}
