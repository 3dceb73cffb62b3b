"""MariaDB's system-versioned tables, applied from the binlog as their current rows.

A system-versioned table (``WITH SYSTEM VERSIONING``) keeps every old version of a row in the
same table, its period ended; ``SELECT`` (and so a snapshot) gives the current rows only, whose
period ends at the largest TIMESTAMP. Its rows events hold both kinds (MariaDB 10.11, period
columns declared or not):

- an insert writes a current row;
- an update changes the current row and writes the old version as a history row (a key change
  the same way);
- a delete changes the current row into a history row (its period end set): an update event;
- ``DELETE HISTORY`` deletes history rows; ``REPLACE`` and ``INSERT ... ON DUPLICATE KEY
  UPDATE`` do the above for each row they replace or update.

So a row image whose period ends at the largest TIMESTAMP is the current row, any other a
history row: a history row written or deleted is left out, and an update whose after image is a
history row is the delete of its before image's key (`classify`). A table that declares no period
columns has them all the same, hidden: the server logs ``row_start`` and ``row_end`` after its
columns (`logged`). A table versioned by transaction ids (``BIGINT UNSIGNED`` periods) is logged
as statements, which re-read it (docs/limits.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from orchestrator.schema.tables import PERIOD_BY_TIME, ColumnInfo, TableInfo

#: The period columns the server adds to a table that declares none, logged after its columns.
HIDDEN = (
    ColumnInfo("row_start", "timestamp", "timestamp(6)", False, datetime_precision=6),
    ColumnInfo("row_end", "timestamp", "timestamp(6)", False, datetime_precision=6),
)

#: The fraction of the largest TIMESTAMP(6) (.999999) in the binlog's TIMESTAMP2 form, and its
#: seconds: 2038-01-19 03:14:07 (2**31 - 1), or 2106-02-07 06:28:15 (2**32 - 1) on MariaDB 11.5+.
_LAST_FRACTION = (999_999).to_bytes(3, "big")
_LAST_SECONDS = (b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff")


def logged(info: TableInfo) -> TableInfo:
    """The columns a system-versioned table's rows events hold: its own, then the hidden period
    columns when it declares none (``row_end`` named as its period end). Any other table as it
    is."""
    if not info.versioned or info.row_end is not None:
        return info
    return dataclasses.replace(info, columns=(*info.columns, *HIDDEN), row_end="row_end")


def applied(info: TableInfo) -> bool:
    """Whether a table's rows events are applied as its current rows (`logged`'s shape: a
    system-versioned table whose period ends in a TIMESTAMP(6) column), not re-read.

    >>> t = TableInfo("d", "t", (ColumnInfo("id", "int", "int(11)", False),), ("id",), (), 0,
    ...               versioned=True)
    >>> applied(t), applied(logged(t))
    (False, True)
    """
    if not info.versioned or info.row_end is None:
        return False
    try:
        end = info.column(info.row_end)
    except KeyError:
        return False
    return end.column_type == PERIOD_BY_TIME


def end_index(info: TableInfo) -> int:
    """The index of the period end among `logged`'s columns."""
    shape = logged(info)
    names = [c.name.lower() for c in shape.columns]
    return names.index((shape.row_end or "").lower())


def current(end: object) -> bool:
    """Whether a period end (as the fast decoder gives a TIMESTAMP(6): its binlog bytes) is the
    largest TIMESTAMP: the row is current, not history.

    >>> last = (2**31 - 1).to_bytes(4, "big") + (999_999).to_bytes(3, "big")
    >>> current(last), current(b"\\x65" + last[1:]), current(b"\\xff" + last[1:])
    (True, False, True)
    """
    if not isinstance(end, bytes | bytearray) or len(end) != 7:
        raise ValueError(f"a period end of {end!r}: a TIMESTAMP(6) expected")
    return bytes(end[4:]) == _LAST_FRACTION and bytes(end[:4]) in _LAST_SECONDS


def classify(op: str, ends: Sequence[object]) -> list[str | None]:
    """Each row's change as the table's current rows see it, from its event's op (``I``, ``U``,
    ``D``) and its image's period end (the after image of an update, the before image of a
    delete): the op, ``D`` for an update that ended the row's period, or None (a history row
    written or deleted: not a change of the current rows).

    >>> now, last = b"\\x65\\x00\\x00\\x00\\x00\\x00\\x01", b"\\x7f\\xff\\xff\\xff\\x0f\\x42\\x3f"
    >>> classify("I", [last, now]), classify("U", [last, now]), classify("D", [now, last])
    (['I', None], ['U', 'D'], [None, 'D'])
    """
    if op == "U":
        return ["U" if current(end) else "D" for end in ends]
    return [op if current(end) else None for end in ends]


def note(info: TableInfo) -> str:
    """What doctor's table check says of a system-versioned table ('' of any other)."""
    if not info.versioned:
        return ""
    if applied(logged(info)):
        return "; system-versioned: its history rows are left out of the changes applied"
    return (
        "; system-versioned by transaction ids: logged as statements, so each change re-reads "
        "it whole (docs/limits.md)"
    )
