"""Tables without a key: what every step needs to know of them (docs/design.md, "Tables without a
key").

A table with no primary key, no unique NOT NULL key and no ``chunk_key`` configured is planned
with strategy `STRATEGY` and an empty chunk key: one chunk, the whole table, read by the driver in
a consistent snapshot at a known position ``S`` (`orchestrator.pipeline.read.keyless`); its capture
keeps every column's before image (`capture_key`), and reconcile applies its changes as multiset
operations on rows (`orchestrator.pipeline.reconcile.multiset`): an insert adds a row, a delete
removes one identical row, an update does both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchestrator.schema.tables import TableInfo

#: The plan's strategy of a table without a key.
STRATEGY = "keyless"


class Planned(Protocol):
    """A table of a run, as far as this needs it (`orchestrator.state.store.RunTableRecord`)."""

    @property
    def chunk_key(self) -> list[str]: ...


def is_keyless(record: Planned) -> bool:
    """Whether a run's table was planned without a key (published as the multiset of its rows):
    its chunk key is empty, as its manifest's is once published."""
    return not record.chunk_key


def capture_key(table: TableInfo, chunk_key: Sequence[str]) -> tuple[str, ...]:
    """The columns whose before image a change of ``table`` carries (``_tm_old_<c>``): its chunk
    key, or, without one, every column (an update removes its whole before image).

    >>> from orchestrator.schema.tables import ColumnInfo
    >>> t = TableInfo("s", "t", (ColumnInfo("a", "int", "int", True),
    ...                          ColumnInfo("b", "int", "int", True)), (), (), 0)
    >>> capture_key(t, ["a"]), capture_key(t, [])
    (('a',), ('a', 'b'))
    """
    return tuple(chunk_key) if chunk_key else tuple(c.name for c in table.columns)


def reason(table: TableInfo) -> str:
    """Why a table is published as the multiset of its rows, for `plan`, `doctor` and the log.

    >>> print(reason(TableInfo("shop", "log", (), (), (), 0)))
    table shop.log has no primary key and no unique NOT NULL key: published as the multiset of \
its rows (identical rows as many times as the source holds them), read whole at one binlog \
position by the driver
    """
    return (
        f"table {table.name} has no primary key and no unique NOT NULL key: published as the "
        "multiset of its rows (identical rows as many times as the source holds them), read "
        "whole at one binlog position by the driver"
    )
