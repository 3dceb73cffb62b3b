"""The change records capture writes and both reconcile engines read: one home for their columns.

A change segment's row is a binlog position (``_tm_file, _tm_pos, _tm_row``), the
operation (``_tm_op``: ``I``/``U``/``D``), the row image in staging types, and
``_tm_old_<c>`` per chunk-key column (the before-image key of updates and deletes).
A ``D`` whose old key differs from its image's key also deletes the old key (an update
that left the table's ``where`` filter: `orchestrator.pipeline.filtering`).
Reconcile turns changes into events: a key, a position and a kind (put or delete).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.schema.tables import TableInfo

#: The change's binlog position, compared as a tuple.
POSITION = ("_tm_file", "_tm_pos", "_tm_row")
#: The operation: "I", "U" or "D".
OP = "_tm_op"
#: The columns every change segment starts with.
META_COLUMNS = (*POSITION, OP)
#: Prefix of the before-image key columns.
OLD_PREFIX = "_tm_old_"
#: An event's kind column: `PUT` the row, or `DELETE` the key.
KIND = "_tm_kind"
PUT, DELETE = 1, 0


def event_key(i: int) -> str:
    """The name of an event's ``i``-th key column.

    >>> event_key(0)
    '_tm_k0'
    """
    return f"_tm_k{i}"


def key_names(table: TableInfo, key: Sequence[str]) -> tuple[str, ...]:
    """The chunk key the changes are keyed on, as the table spells its columns."""
    if not key:
        raise ValueError(f"table {table.name}: reconcile needs a chunk key")
    return tuple(table.column(k).name for k in key)
