"""Following a pipeline to another server of its replication topology, by GTID.

A recorded position is a file offset in one server's binlog. When the configured source is
another server (a failover, a new replica) or the same server after ``RESET MASTER``, that
offset means nothing there - and reading from it would apply a wrong range of changes. Two
things tell: the identity recorded with the position (``server_id``, MySQL's
``server_uuid``) against the source's, and, where both are the same, the GTID set the source
gives for that offset against the one recorded (`Follower.foreign`).

A foreign position is carried over by its GTID set (`Follower.place`): the source is asked
for its binlog after that set, as a GTID replica asks (`orchestrator.binlog.stream`, strict
mode), and the first place it would send from is the same point in the topology's history:

- MariaDB announces the place with an artificial GTID_LIST event once every domain reached
  the set (or sends an event group of a domain that is already past it: its start is the
  place then). The GTID position the source gives for that place must lie within the
  recorded set (`mariadb_covers`): then every transaction before it is in the published
  version, and the ones after it that are too are applied again, which changes nothing
  (last change wins with full row images).
- MySQL sends only transactions outside the set; the first one's start is the place. If
  the source's executed set is the recorded one, its current position is.

When the set is not in the source's binlog (purged, diverged, another topology), or no set
was recorded, the position is *lost*: the tables that needed it are read again, and the log
says why. Nothing is ever applied from an offset of another server.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

import pymysql

from orchestrator.binlog import events as ev
from orchestrator.binlog.gtid import mariadb_covers, parse_mariadb, same_set
from orchestrator.binlog.stream import DumpStream, dump_settings
from orchestrator.config import PipelineConfig
from orchestrator.errors import GtidNotInBinlog
from orchestrator.positions import BinlogPosition
from orchestrator.source.connect import connect
from orchestrator.source.connection import Source
from orchestrator.state.store import RunRecord, StateStore

log = logging.getLogger("orchestrator.binlog.failover")

_GROUP_STARTS = frozenset({ev.MARIADB_GTID, ev.MYSQL_GTID, ev.MYSQL_ANONYMOUS_GTID})


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a recorded position is on the source.

    Attributes:
        how: ``same`` (the source's own binlog position), ``moved`` (another server's,
            found on the source by its GTID set) or ``lost`` (cannot be found: re-read).
        recorded: the position as recorded.
        position: where to go on from on the source (None when lost).
        reason: why it is not the source's own (empty for ``same``).
        failure: why it cannot be found on the source (``lost`` only).
    """

    how: Literal["same", "moved", "lost"]
    recorded: BinlogPosition
    position: BinlogPosition | None
    reason: str = ""
    failure: str = ""

    def __str__(self) -> str:
        at = f"binlog position {self.recorded}"
        match self.how:
            case "same":
                return f"{at} is the source's own"
            case "moved":
                assert self.position is not None
                return (
                    f"{at}: {self.reason}; its GTID set {self.recorded.gtid_set} is "
                    f"{self.position} there: going on from it, no table re-read"
                )
            case "lost":
                return f"{at}: {self.reason}; cannot go on from it: {self.failure}"


class Follower:
    """Places recorded positions on the source, each distinct one once (the tables of a
    pipeline mostly share one).

    Args:
        config: the pipeline (the binlog connection's settings and replica id).
        source: the source, open.
    """

    def __init__(self, config: PipelineConfig, source: Source) -> None:
        self.config = config
        self.source = source
        self.identity = source.identity()
        self._files = {name for name, _ in source.binlogs()}
        self._placed: dict[tuple[Any, ...], Placement] = {}

    def foreign(self, position: BinlogPosition, *, history: bool = True) -> str | None:
        """Why ``position`` is not a place in the source's binlog, or None when it is.

        Args:
            position: a recorded position.
            history: also compare the GTID set the source gives for the offset with the
                recorded one (``RESET MASTER``, a binlog of the same name on another server
                with the same ``server_id``); skipped when the file is gone (purged) or no
                set was recorded.
        """
        if self.identity.wrote(position) is False:
            return (
                f"it was recorded on {position.server}, "
                f"the source {self.source.address} is {self.identity}"
            )
        if not history or position.gtid_set is None or position.file not in self._files:
            return None
        dialect = self.source.dialect
        if dialect.gtid_position_sql is not None:
            if continues_at(self.source, position):
                return None
            here = self.source.query(dialect.gtid_position_sql, (position.file, position.pos))[0][0]
            if here is None or not same_set(str(here), position.gtid_set, dialect.flavor):
                return (
                    f"the binlog of the source {self.source.address} ({self.identity}) is at GTID "
                    f"set {here or '(none)'} there, not {position.gtid_set} as recorded: its "
                    "binlog was reset, or it is another server's"
                )
            return None
        subset = self.source.query(
            "SELECT GTID_SUBSET(%s, @@global.gtid_executed)", (position.gtid_set,)
        )[0][0]
        if not int(subset or 0):
            return (
                f"the source {self.source.address} ({self.identity}) has not executed GTID set "
                f"{position.gtid_set}, recorded with it: its binlog was reset, or it is another "
                "server's"
            )
        return None

    def place(self, position: BinlogPosition) -> Placement:
        """Where ``position`` is on the source (logged once per distinct position)."""
        key = (
            position.file,
            position.pos,
            position.row,
            position.server_id,
            position.server_uuid,
            position.gtid_set,
        )
        if key not in self._placed:
            self._placed[key] = placement = self._place(position)
            if placement.how == "moved":
                log.info("%s", placement)
            elif placement.how == "lost":
                log.warning("%s; what needs it is read again", placement)
        return self._placed[key]

    def _place(self, position: BinlogPosition) -> Placement:
        reason = self.foreign(position)
        if reason is None:
            return Placement("same", position, position)
        if position.gtid_set is None:
            return Placement("lost", position, None, reason, "no GTID set was recorded with it")
        try:
            found = self._locate(position.gtid_set)
        except GtidNotInBinlog as exc:
            return Placement("lost", position, None, reason, str(exc))
        if isinstance(found, str):
            return Placement("lost", position, None, reason, found)
        return Placement("moved", position, found, reason)

    def _locate(self, gtid_set: str) -> BinlogPosition | str:
        """The source's binlog position just after ``gtid_set``, or why there is none."""
        dialect = self.source.dialect
        if dialect.flavor == "mysql":
            now = self.source.current_position()
            if same_set(now.gtid_set, gtid_set, "mysql"):
                return now
        found = self._first_place(gtid_set)
        if found is None:
            return (
                f"the binlog of {self.source.address} ended before GTID set {gtid_set} was reached"
            )
        file, pos = found
        if dialect.gtid_position_sql is None:
            return BinlogPosition(file, pos).on(self.identity, gtid_set)
        here = self.source.query(dialect.gtid_position_sql, (file, pos))[0][0]
        if here is None or not mariadb_covers(parse_mariadb(gtid_set), parse_mariadb(str(here))):
            return (
                f"the binlog of {self.source.address} at {file}:{pos}, where GTID set {gtid_set} "
                f"ends, is at GTID set {here or '(none)'}, which holds transactions outside it"
            )
        return BinlogPosition(file, pos).on(self.identity, str(here) or None)

    def _first_place(self, gtid_set: str) -> tuple[str, int] | None:
        """``(file, pos)`` where a GTID dump from ``gtid_set`` starts sending, or None at the
        end."""
        source = self.config.source
        stream = DumpStream(
            connect,
            dump_settings(source, self.config.resolve_password()),
            source.server_id,
            "",
            4,
            self.source.address,
            gtid=gtid_set,
        )
        file = ""
        try:
            for packet in stream:
                kind = packet[5]
                start, end, artificial = ev.placed(packet)
                if kind == ev.ROTATE:
                    file = ev.rotate(packet)[0]
                elif kind in _GROUP_STARTS and end and not artificial:
                    return file, start  # a transaction outside the set: it starts here
                elif kind == ev.MARIADB_GTID_LIST and end and artificial:
                    return file, end  # MariaDB: every domain reached the set here
            return None
        finally:
            stream.close()


#: A MariaDB GTID event's text in ``SHOW BINLOG EVENTS`` (``BEGIN GTID 0-1-12``, ``GTID 0-1-13``
#: for a DDL, an XA group's ``XA START ... GTID 0-1-14``).
_GTID_INFO = re.compile(r"\bGTID (\d+)-(\d+)-(\d+)$")


def continues_at(source: Source, position: BinlogPosition) -> bool:
    """Whether the MariaDB source's binlog continues from ``position``'s recorded set there: the
    event at the offset is the GTID event of the next transaction (in its domain, the next
    sequence number), or nothing follows yet and the offset and set are the source's current
    ones. Asked before ``BINLOG_GTID_POS``, which reads the binlog file from its start to the
    offset (0.1-0.14 s of the server at 500 MiB into a file, docs/performance.md); this reads
    one event, or the binlog status.

    A position the capture records is where an event group ends, so in the binlog it was
    recorded in, the next group's GTID event starts there and carries that number. Another
    history (``RESET MASTER``, a same-named file of another server) would need a GTID event
    starting at that very byte with that very number, or to end at that very byte with that
    very set; the set ``BINLOG_GTID_POS`` compares would be the recorded one there too. False
    (ask ``BINLOG_GTID_POS``) when the event is another kind (a rotation, a checkpoint), its
    number is not the next one (a domain's first transaction, ``gtid_seq_no`` set by hand),
    the offset is not an event's, a commit came in meanwhile, or the statement is refused."""
    if position.row:
        return False
    try:
        recorded = parse_mariadb(position.gtid_set)
    except ValueError:  # not a MariaDB set: BINLOG_GTID_POS's comparison says so
        return False
    try:
        rows = source.query(
            "SHOW BINLOG EVENTS IN %s FROM %s LIMIT 1", (position.file, int(position.pos))
        )
    except pymysql.MySQLError as exc:  # not an event's offset (1220), or no privilege
        log.debug("SHOW BINLOG EVENTS at %s: %s", position, exc)
        return False
    if not rows:  # nothing written after it yet, or past the file's end
        here = source.current_position()
        return here.key == position.key and same_set(here.gtid_set, position.gtid_set, "mariadb")
    if rows[0][2] != "Gtid":
        return False
    found = _GTID_INFO.search(str(rows[0][5]))
    if found is None:
        return False
    domain, _, seq = (int(g) for g in found.groups())
    return domain in recorded and seq == recorded[domain][1] + 1


def moved_run(follower: Follower, store: StateStore, run: RunRecord) -> str | None:
    """Why the unfinished ``run``'s positions are not the source's (its ``P0`` - also by
    GTID set, `Follower.foreign` - then any other it recorded: ``H``, the capture's
    checkpoint, each chunk's ``L`` and ``Hb``), or None when they all are."""
    checkpoint = store.capture_checkpoint(run.run_id)
    recorded = [run.high_position, checkpoint["position"] if checkpoint else None]
    recorded += [p for c in store.chunks(run.run_id) for p in (c.low, c.high)]
    if run.start_position is not None:
        reason = follower.foreign(BinlogPosition.from_json(run.start_position))
        if reason is not None:
            return (
                f"its start position {BinlogPosition.from_json(run.start_position)} "
                f"is not the source's: {reason}"
            )
    for data in recorded:
        if data is not None and (
            reason := follower.foreign(BinlogPosition.from_json(data), history=False)
        ):
            return f"its position {BinlogPosition.from_json(data)} is not the source's: {reason}"
    return None
