"""XA transactions in the capture: their rows count at their ``XA COMMIT``, never before.

An XA transaction's rows events come in its own event group (``XA START`` ...
``XA END``, closed by ``XA PREPARE``); its outcome, ``XA COMMIT`` or ``XA ROLLBACK``,
comes later in another group, possibly in another run. So rows are held per xid:

* committed: they are applied at the position of the ``XA COMMIT`` event (no other
  transaction can change those rows between PREPARE and COMMIT: the prepared one
  holds their locks), so a snapshot read before the commit - which did not see them -
  gets them, and one after it gets them again, which changes nothing;
* rolled back: dropped;
* still prepared at ``H``: not applied, and the capture's checkpoint (and the tables'
  next start) stays at the boundary where the transaction's group began, so whoever
  reads on - a resumed capture, or the next run - reads its rows again and applies
  them at its commit. Replaying from an earlier position is always exact with full
  row images (docs/design.md).
* one holding nothing the capture decodes (rows of tables outside the run only): each
  table's next start carries its xid (`XA_KNOWN`), so that the runs after know its
  commit, with nothing to apply, without reading its group again. A table keeps the xid
  while the transaction stays prepared, and drops it at its outcome.
* one holding rows of tables decoded but not kept (a parent outside the run, whose rows
  derive cascades; a table failed or waiting for a re-read) holds the other tables'
  next start too, once: the next run then sees its group, and its commit is one it
  knows. One still prepared at the end of that run (begun before the run's tables'
  start) is let go: were it held again, every run would read the binlog again from
  where it began.

A change of rows the binlog holds no images of inside the transaction (a statement-format
session's, `TableChange` ``rows``) is held the same way: the rows change when it commits, so
the table is re-read from the commit on (a re-read before it could not see the change), and
not at all if it rolls back.

``XA COMMIT ... ONE PHASE`` ends its own group (MySQL logs it after XA END; MariaDB
logs it as an ordinary transaction). A commit of an xid whose rows were before the
capture began (prepared before a snapshot's start, or a transaction of other tables
let go) cannot be applied: the caller re-reads the run's tables that do not know it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.binlog.reader import RowsEvent, TableChange, XaEvent
from orchestrator.binlog.statements import Xid
from orchestrator.positions import BinlogPosition

log = logging.getLogger("orchestrator.pipeline.capture.step")  # the capture's lines

#: The key marking a table's next start (its checkpoint's position) held back for an XA
#: transaction of other tables (`orchestrator.pipeline.capture.step`, ``hold_prepared``): the
#: next run holds it back no further for a transaction that began there or before.
XA_FOREIGN = "xa_foreign"
#: The key of a table's next start listing the XA transactions prepared there that hold
#: nothing the capture decodes (`xid_text`): their commit, when a later run sees it, changes
#: nothing of the table.
XA_KNOWN = "xa_known"
#: At most this many such transactions a table: the commit of one left out re-reads it.
MAX_KNOWN = 100
#: The key of a capture checkpoint's position listing the outcomes the capture passed of
#: transactions its tables' starts knew (`XA_KNOWN`): a capture resumed from it knows them
#: ended, and its tables stop knowing them.
XA_ENDED = "xa_ended"


def xid_text(xid: Xid | None) -> str:
    """An xid as a table's next start records it (`XA_KNOWN`).

    >>> xid_text(Xid(b"ab", b"c", 7))
    '7:6162:63'
    """
    return "" if xid is None else f"{xid.format_id}:{xid.gtrid.hex()}:{xid.bqual.hex()}"


@dataclass(frozen=True, slots=True)
class Holds:
    """Where tables' next starts stay for XA transactions prepared at a capture's end: ``own``
    for those with rows of the table, ``foreign`` for those with rows of other tables only;
    ``known``: the transactions holding nothing decoded whose commit each table knows."""

    own: dict[str, BinlogPosition]
    foreign: dict[str, BinlogPosition]
    known: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def next_starts(self, stop: BinlogPosition) -> dict[str, dict[str, Any]]:
        """The next start of each table that does not simply go on from ``stop``."""
        starts = {}
        for table in self.own.keys() | self.foreign.keys() | self.known.keys():
            at = self.own.get(table) or self.foreign.get(table) or stop
            marks: dict[str, Any] = {XA_FOREIGN: True} if table in self.foreign else {}
            if table in self.known:
                marks[XA_KNOWN] = self.known[table]
            starts[table] = {**at.to_json(), **marks}
        return starts


#: What an XA transaction holds until its outcome: its rows, and its changes of rows without
#: images (`TableChange` ``rows``).
Held = RowsEvent | TableChange


def _names(event: Held) -> frozenset[str]:
    return event.tables if isinstance(event, TableChange) else frozenset((event.table,))


class XaTransactions:
    """The rows of XA transactions not yet committed or rolled back."""

    def __init__(self, known: Iterable[str] = (), checkpoint: Mapping[str, Any] | None = None):
        """``known``: what the tables' starts know (`XA_KNOWN`); ``checkpoint``: the position of
        the capture checkpoint this capture resumes from."""
        self.group: list[Held] | None = None  # what the XA group being read holds
        self.group_start: BinlogPosition | None = None
        self.prepared: dict[Xid | None, tuple[BinlogPosition, list[Held]]] = {}
        self.known = frozenset(known)
        # the outcomes seen of those (`xid_text`), since the capture began
        self.ended: set[str] = set((checkpoint or {}).get(XA_ENDED, ()))

    def take(self, event: Held) -> bool:
        """Hold the event if it belongs to an XA transaction and takes effect at its outcome (a
        change of shape, or of the binlog, takes effect at once); whether it did."""
        if self.group is None or (isinstance(event, TableChange) and not event.rows):
            return False
        self.group.append(event)
        return True

    def step(self, record: XaEvent) -> list[Held] | None:
        """Follow one XA step; on ``commit`` what takes effect now (moved to the commit's
        position), on ``rollback`` nothing, and None for the commit of an xid never seen."""
        if record.kind == "start":
            self.group, self.group_start = [], record.group_start
            return []
        if record.kind == "end":
            self.prepared[record.xid] = (self.group_start or record.group_start, self.group or [])
            self.group = self.group_start = None
            return []
        held = self.prepared.pop(record.xid, None)
        if (xid := xid_text(record.xid)) in self.known:
            self.ended.add(xid)
        if record.kind == "rollback":
            return []
        if held is None:
            return None
        return [dataclasses.replace(event, file=record.file, end=record.end) for event in held[1]]

    def outcomes(self) -> dict[str, list[str]]:
        """What a capture checkpoint records of the outcomes seen (`XA_ENDED`)."""
        return {XA_ENDED: sorted(self.ended)} if self.ended else {}

    def hold(self) -> BinlogPosition | None:
        """Where a capture must resume to see every transaction still held (None: anywhere)."""
        starts = [start for start, _ in self.prepared.values()]
        if self.group_start is not None:
            starts.append(self.group_start)
        return min(starts, default=None)

    def holds(
        self,
        live: Mapping[str, tuple[BinlogPosition, bool]],
        stop: BinlogPosition,
        known: Mapping[str, Iterable[str]] | None = None,
    ) -> Holds:
        """Where the next start of each table stays, at the end of a capture at ``stop``.

        Args:
            live: the run's tables that keep rows (not failed, not to be re-read): their start
                and whether the run before held it back for a transaction of other tables
                (`XA_FOREIGN`).
            stop: the capture's end, ``H``.
            known: the transactions each table's start knew (`XA_KNOWN`), for those still
                prepared to be known on.
        """
        known = self.knowing(live, known or {})
        hold = self.hold()
        if hold is None:
            return Holds({}, {}, known)
        touched = sorted(self.tables() & live.keys())
        for table in touched:
            log.warning(
                "table %s: an XA transaction begun at %s is not committed at %s; its rows "
                "wait for the run that sees its commit",
                table,
                hold,
                stop,
            )
        other = min(
            (
                start
                for start, events in self.prepared.values()
                if events and not any(_names(event) & live.keys() for event in events)
            ),
            default=None,
        )
        if other is None:
            return Holds(dict.fromkeys(touched, hold), {}, known)
        foreign = {  # once: a table held back for one that began at or before its start is let go
            table: other
            for table, (start, held) in sorted(live.items())
            if table not in touched and not (held and other.key <= start.key)
        }
        if foreign:
            log.info(
                "an XA transaction of other tables begun at %s is not committed at %s: the next "
                "run reads %d table(s) from there, where it sees the transaction begin",
                other,
                stop,
                len(foreign),
            )
        elif not touched:
            log.warning(
                "an XA transaction of other tables begun at %s is still not committed at %s: "
                "let go; if it commits, the run that sees its commit reads this run's tables "
                "again (docs/limits.md)",
                other,
                stop,
            )
        return Holds(dict.fromkeys(touched, hold), foreign, known)

    def knowing(
        self, live: Iterable[str], known: Mapping[str, Iterable[str]]
    ) -> dict[str, list[str]]:
        """What each table knows at the capture's end: the prepared transactions that hold
        nothing decoded, and those its start knew whose outcome the capture did not see."""
        empty = {xid_text(x) for x, (_, events) in self.prepared.items() if x and not events}
        if empty:
            log.info(
                "%d XA transaction(s) of tables outside the run prepared, not committed: the "
                "next starts record them (their commit reads nothing again)",
                len(empty),
            )
        knowing = {}
        for table in live:
            xids = sorted(empty | (set(known.get(table, ())) - self.ended))
            if len(xids) > MAX_KNOWN:
                log.warning(
                    "table %s: %d XA transactions of other tables prepared; the commit of the "
                    "%d past %d will re-read it",
                    table,
                    len(xids),
                    len(xids) - MAX_KNOWN,
                    MAX_KNOWN,
                )
            if xids:
                knowing[table] = xids[:MAX_KNOWN]
        return knowing

    def tables(self) -> set[str]:
        """The tables with rows held."""
        held = [event for _, events in self.prepared.values() for event in events]
        return {name for event in [*held, *(self.group or [])] for name in _names(event)}
