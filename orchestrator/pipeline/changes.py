"""The change records capture writes and both reconcile engines read: one home for their columns.

A change segment's row is a binlog position (``_tm_file, _tm_pos, _tm_row``), the
operation (``_tm_op``: ``I``/``U``/``D``), the row image in staging types, and
``_tm_old_<c>`` per chunk-key column (the before-image key of updates and deletes).
A ``D`` whose old key differs from its image's key also deletes the old key (an update
that left the table's ``where`` filter: `orchestrator.pipeline.capture.filtering`).
Reconcile turns changes into events: a key, a position and a kind (put or delete).
Every column Tidemark adds starts with `RESERVED_PREFIX`: a table with a column named so
cannot be planned (`reserved_columns`; doctor fails it too), as its changes would hold two
columns of one name.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.schema.tables import TableInfo

#: The prefix of every column Tidemark adds to change segments and reconcile's events; a source
#: column may not have it, in any case (Spark resolves column names case-insensitively).
RESERVED_PREFIX = "_tm_"

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


def reserved_columns(table: TableInfo) -> str | None:
    """What is wrong with a table having columns named like Tidemark's own (`RESERVED_PREFIX`,
    in any case), with the fix; None when it has none.

    >>> from orchestrator.schema.tables import ColumnInfo
    >>> cols = tuple(ColumnInfo(n, "int", "int", True) for n in ("id", "_TM_op", "tm_x"))
    >>> print(reserved_columns(TableInfo("shop", "t", cols, ("id",), (), 0)))
    table shop.t: column `_TM_op` is named like Tidemark's own change columns (names starting \
with `_tm_`, in any case, are reserved: its changes could not be applied); rename it at the \
source (ALTER TABLE shop.t RENAME COLUMN `_TM_op` TO ...) or leave the table out of the pipeline
    """
    names = [c.name for c in table.columns if c.name.lower().startswith(RESERVED_PREFIX)]
    if not names:
        return None
    listed = ", ".join(f"`{n}`" for n in names)
    return (
        f"table {table.name}: column{'s' if len(names) > 1 else ''} {listed} "
        f"{'are' if len(names) > 1 else 'is'} named like Tidemark's own change columns (names "
        f"starting with `{RESERVED_PREFIX}`, in any case, are reserved: its changes could not be "
        f"applied); rename {'them' if len(names) > 1 else 'it'} at the source (ALTER TABLE "
        f"{table.name} RENAME COLUMN `{names[0]}` TO ...) or leave the table out of the pipeline"
    )
