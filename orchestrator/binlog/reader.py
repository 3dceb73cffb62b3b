"""Framing the binlog: rows events of chosen tables and transaction boundaries.

`EventReader` reads the replication stream (`orchestrator.binlog.stream`)
from a start position to a stop position, follows rotations, keeps the
TABLE_MAPs of the chosen tables (checking each against the planned shape), and
yields their rows events undecoded (`RowsEvent`) together with `Boundary`
records at transaction ends - the only safe places to resume: resuming inside a
transaction loses its TABLE_MAP events. Rows events of other tables are skipped
without reading their rows. A QUERY event whose statement changes a chosen table
(TRUNCATE, DDL, statement-format DML, anything unparseable naming it; see
`orchestrator.binlog.statements`), a TABLE_MAP whose shape or metadata differs
from the planned one (`orchestrator.binlog.shape`), and a rows event whose images do not
hold every column, are yielded as `TableChange`: the table's rows must be read again.
Compressed events are expanded into the plain events they stand for
(`orchestrator.binlog.compressed`), at the compressed event's position.

Positions: a row's position is the end of its rows event (what ``SHOW MASTER
STATUS`` would have said right after it) and its index within the event; a
boundary's is the end of the event that closes the transaction (XID, COMMIT, a
standalone DDL), the start of the next file after a rotation, or the stop. A
boundary carries the server's identity and the GTID set there (`GtidTracker`: the
start's set plus every GTID event since). The server must be the one the start and
stop positions were recorded on (`SourceChanged` otherwise: offsets of another
server's binlog mean nothing here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Literal, Self

import pymysql

from orchestrator.binlog import events as ev
from orchestrator.binlog.compressed import COMPRESSED, expand
from orchestrator.binlog.gtid import GtidTracker
from orchestrator.binlog.shape import metadata_difference, shape_difference
from orchestrator.binlog.statements import Xid, fold, redacted
from orchestrator.binlog.stream import DumpStream, dump_settings
from orchestrator.config import SourceConfig
from orchestrator.errors import (
    BinlogConnectionLost,
    BinlogPurged,
    RunFailed,
    SourceChanged,
    source_timeout,
)
from orchestrator.positions import BinlogPosition, ServerIdentity, file_index
from orchestrator.schema.tables import TableInfo
from orchestrator.source.connect import connect
from orchestrator.source.dialect import Dialect
from orchestrator.source.retry import is_timeout

log = logging.getLogger(__name__)

Op = Literal["I", "U", "D"]

#: Why a table is re-read at a rows event without every column in its images: a session that
#: set ``binlog_row_image`` to ``MINIMAL`` or ``NOBLOB`` (the source's default is checked by
#: doctor, a session's is not), or MySQL's partial JSON updates (``binlog_row_value_options``).
#: The after-image then is not the row's state, so the table is read again from there, as for a
#: TABLE_MAP of another shape, and the run goes on (docs/design.md).
NOT_FULL = "a rows event without full row images (a session's binlog_row_image is not FULL)"
PARTIAL_JSON = (
    "a partial JSON update (binlog_row_value_options=PARTIAL_JSON: set it to '' on the source)"
)


@dataclass(frozen=True, slots=True)
class Boundary:
    """A place where no transaction is open: a stream may resume from ``position``.

    ``kind`` is ``commit`` (end of an XID/COMMIT/DDL event), ``rotate`` (start of
    the next binlog file) or ``stop`` (the stop position was reached).
    """

    position: BinlogPosition
    kind: Literal["commit", "rotate", "stop"]


@dataclass(frozen=True, slots=True)
class RowsEvent:
    """A rows event of a chosen table, undecoded.

    Attributes:
        table: ``database.table``.
        op: ``I``, ``U`` or ``D``; an UPDATE's rows are (before, after) image pairs.
        file: the binlog file.
        end: the event's end position (a row's position is ``(file, end, index)``).
        packet: the event as the stream sent it.
        rows: where its row images are in ``packet``.
        table_map: the TABLE_MAP it refers to.
        format: the format of the binlog it is in.
    """

    table: str
    op: Op
    file: str
    end: int
    packet: bytes
    rows: ev.RowsLayout
    table_map: ev.TableMap
    format: ev.Format


@dataclass(frozen=True, slots=True)
class TableChange:
    """A change of chosen tables the binlog holds no row images of: their rows must be re-read.

    Attributes:
        tables: the chosen tables it changes (``database.table`` as configured).
        what: what happened, for the log (``TRUNCATE TABLE t``, ``a TABLE_MAP of another shape``).
        file: the binlog file.
        end: the event's end position: the change is in effect from ``(file, end)`` on.
        rows: a change of rows made by its transaction (a statement-format change, row images
            without every column), not of the tables' shape or of the binlog itself: inside an
            XA transaction it takes effect at the transaction's commit
            (`orchestrator.pipeline.capture.xa`).
    """

    tables: frozenset[str]
    what: str
    file: str
    end: int
    rows: bool = False

    @property
    def position(self) -> BinlogPosition:
        return BinlogPosition(self.file, self.end)


@dataclass(frozen=True, slots=True)
class XaEvent:
    """A step of an XA transaction.

    ``start``: the rows events up to its ``end`` belong to it (MariaDB names the xid only
    at ``end``); ``end``: XA END, naming the xid (the group then ends with XA PREPARE, or
    with ``commit`` for ``XA COMMIT ... ONE PHASE``); ``commit``/``rollback``: its outcome.
    ``group_start`` is the boundary its event group began at (a capture that must keep a
    prepared transaction's rows resumes from there).
    """

    kind: Literal["start", "end", "commit", "rollback"]
    xid: Xid | None
    file: str
    end: int
    group_start: BinlogPosition


Record = RowsEvent | Boundary | TableChange | XaEvent

# --------------------------------------------------------------------------- the reader


class EventReader:
    """The rows events of some tables between two binlog positions, undecoded.

    `events` connects (non-blocking: the stream ends where the binlog ends),
    yields `RowsEvent` and `Boundary` records in binlog order, and closes.

    Args:
        source: the source's connection settings.
        password: its password.
        start: a transaction boundary (``SHOW MASTER STATUS`` or a `Boundary`) to read from.
        tables: the tables to keep, ``{"db.table": TableInfo}``; others are skipped.
        stop: the last position to read (a boundary); None reads to the end of the binlog.
        server_id: the replica id to connect as (default ``source.server_id``).
    """

    def __init__(
        self,
        source: SourceConfig,
        password: str,
        start: BinlogPosition,
        tables: Mapping[str, TableInfo],
        *,
        stop: BinlogPosition | None = None,
        server_id: int | None = None,
    ) -> None:
        self.source = source
        self.start = start
        self.stop = stop
        self.server_id = server_id if server_id is not None else source.server_id
        self.tables = dict(tables)
        self._password = password
        self._stream: DumpStream | None = None
        self._stream_connections = 0
        self._maps: dict[bytes, ev.TableMap] = {}  # TABLE_MAP bodies already parsed and checked
        self._reshaped: dict[bytes, str] = {}  # ... and those of another shape: how
        self._lower_case_table_names = 0
        self._folded: dict[str, str] = {}  # folded name -> the chosen table
        self._collations: dict[str, int] = {}  # collation name -> the id TABLE_MAPs carry
        self._identity: ServerIdentity | None = None  # the server read (`check_available`)
        self._files: list[str] = []  # its binlog files
        self._sizes: dict[str, int] = {}  # ... and their sizes
        self._checked = False
        self._gtid = GtidTracker("mariadb", None)  # the GTID set where the stream is

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    @property
    def address(self) -> str:
        return f"{self.source.host}:{self.source.port}"

    def _settings(self) -> dict[str, Any]:
        return dump_settings(self.source, self._password)

    def _connect(self, **settings: Any) -> pymysql.connections.Connection[Any]:
        """Open a connection; refuses to open a second stream connection.

        A stream resumed after a lost connection at the last event's position
        may be inside a transaction whose TABLE_MAP it then never sees (and
        would drop that transaction's rows). Failing lets the caller resume
        from its last boundary instead.
        """
        if "db" not in settings:  # the stream connection (control ones name a database)
            self._stream_connections += 1
            if self._stream_connections > 1:
                raise BinlogConnectionLost(
                    f"lost the binlog connection to {self.address}; "
                    "the capture resumes from its last checkpoint"
                )
        return connect(**settings)

    def check_available(self) -> None:
        """Fail early when the binlog needed is gone or the stop lies beyond the binlog.

        Raises:
            BinlogPurged: ``start.file`` is no longer on the server.
            RunFailed: ``stop`` is after the server's current position.
        """
        try:
            conn = connect(**self._settings())
        except pymysql.err.MySQLError as exc:
            if is_timeout(exc):
                raise source_timeout(
                    self.address,
                    self.source.read_timeout,
                    f"a connection to read the binlog from {self.start}",
                ) from exc
            raise
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                listed = cur.fetchall()
                files = self._files = [str(row[0]) for row in listed]
                self._sizes = {str(row[0]): int(row[1]) for row in listed if len(row) > 1}
                dialect = Dialect.from_version(conn.get_server_info())
                cur.execute(dialect.binlog_status_sql)
                status = cur.fetchone()
                cur.execute("SELECT @@lower_case_table_names")
                row = cur.fetchone()
                cur.execute("SELECT COLLATION_NAME, ID FROM information_schema.COLLATIONS")
                self._collations = {
                    str(name): int(number) for name, number in cur.fetchall() if number is not None
                }
                self._check_server(cur, dialect)
        finally:
            conn.close()
        self._lower_case_table_names = int(row[0]) if row else 0
        self._folded = {fold(name, self._lower_case_table_names): name for name in self.tables}
        if self.start.file not in files:
            oldest = files[0] if files else "(none)"
            raise BinlogPurged(
                f"binlog file {self.start.file} (needed from {self.start}) is no longer on "
                f"{self.address}; the oldest binlog there is {oldest}. Changes since {self.start} "
                "are lost to this run: the chunks read before it must be read again, and keep "
                "binlogs longer (binlog_expire_logs_seconds / expire_logs_days)"
            )
        if self.stop is not None and status is not None:
            current = BinlogPosition(str(status[0]), int(status[1]))
            if self.stop > current:
                raise RunFailed(
                    f"stop position {self.stop} is after the binlog end {current} "
                    f"on {self.address}; was the server's binlog reset?"
                )
        self._checked = True

    def bytes_to_read(self) -> int | None:
        """The bytes of binlog from the start to the stop (to the end: no stop), by the sizes
        `check_available` listed; None before it ran or when a file is not listed."""
        if not self._checked or self.start.file not in self._sizes:
            return None
        stop = self.stop
        if stop is not None and stop.file == self.start.file:
            return max(0, stop.pos - self.start.pos)
        total = self._sizes[self.start.file] - self.start.pos
        for name in self._files[self._files.index(self.start.file) + 1 :]:
            if stop is not None and name == stop.file:
                return total + stop.pos
            total += self._sizes.get(name, 0)
        return total if stop is None else None

    def _check_server(self, cur: Any, dialect: Dialect) -> None:
        """The server must be the one the start and stop were recorded on; the GTID set at the
        start (asked of the server when the start does not carry it) seeds the tracker."""
        cur.execute(dialect.identity_sql)
        server_id, server_uuid = cur.fetchone()
        self._identity = identity = ServerIdentity(int(server_id), server_uuid and str(server_uuid))
        for what, at in (("start", self.start), ("stop", self.stop)):
            if at is not None and identity.wrote(at) is False:
                raise SourceChanged(
                    f"the binlog {what} position {at} was recorded on {at.server}, but "
                    f"{self.address} is {identity}: the source changed during the run; rerun "
                    "`tidemark run`, which leaves this run and goes on from the published "
                    "positions by GTID"
                )
        gtid = self.start.gtid_set
        if (
            gtid is None
            and dialect.gtid_position_sql is not None
            and self.start.file in self._files
        ):
            cur.execute(dialect.gtid_position_sql, (self.start.file, self.start.pos))
            gtid = (cur.fetchone() or (None,))[0] or None
        self._gtid = GtidTracker(dialect.flavor, None if gtid is None else str(gtid))

    def _at(self, file: str, pos: int) -> BinlogPosition:
        """A boundary of the stream, stamped with the server and the GTID set there."""
        position = BinlogPosition(file, pos)
        return position if self._identity is None else position.on(self._identity, self._gtid.text)

    def events(self) -> Iterator[Record]:
        """The chosen tables' rows events (undecoded) and other changes, and the boundaries,
        in binlog order."""
        if not self._checked:  # `check_available` ran just before: not twice
            self.check_available()
        self._checked = False  # another call of `events` checks again
        log.info(
            "binlog of %s: reading %s to %s for %d table(s)",
            self.address,
            self.start,
            self.stop or "its end",
            len(self.tables),
        )
        self._stream = stream = DumpStream(
            self._connect,
            self._settings(),
            self.server_id,
            self.start.file,
            self.start.pos,
            self.address,
        )
        try:
            yield from self._frame(stream)
        finally:
            self.close()

    def _frame(self, stream: DumpStream) -> Iterator[Record]:
        file = self.start.file
        index = file_index(file)  # (index, end) of an event compares with the stop's
        stop = (file_index(self.stop.file), self.stop.pos) if self.stop is not None else None
        fmt = ev.Format()
        maps: dict[int, ev.TableMap | None] = {}  # table id -> map (None: not a chosen table)
        in_transaction = False
        last = self._at(self.start.file, self.start.pos)  # where the current event group began
        for outer in stream:
            kind, end = ev.header(outer)  # end is 0 for the fake events sent on connecting
            if kind == ev.FORMAT_DESCRIPTION:
                fmt = ev.Format.parse(outer)
                continue
            if end and stop is not None and (index, end) > stop:
                break
            if kind == ev.ROTATE:
                maps.clear()  # table ids are reused after a server restart
                file, position = ev.rotate(outer)
                index = file_index(file)
                if end:
                    last = self._at(file, position)
                    yield Boundary(last, "rotate")
                continue
            # A compressed event stands for one plain event (MariaDB) or a whole transaction
            # (MySQL), each at the compressed event's position.
            packets = expand(outer, fmt, kind, f"{file}:{end}") if kind in COMPRESSED else (outer,)
            for packet in packets:
                if packet is not outer:
                    kind = ev.header(packet)[0]
                if kind in ev.ROWS_OPS or kind == ev.PARTIAL_UPDATE_ROWS:
                    event = self._rows(packet, fmt, kind, maps, file, end)
                    if event is not None:
                        yield event
                elif kind == ev.TABLE_MAP:
                    reshaped = self._table_map(packet, fmt, maps)
                    if reshaped is not None:
                        yield TableChange(frozenset({reshaped[0]}), reshaped[1], file, end)
                elif kind == ev.MARIADB_GTID:
                    self._gtid.seen(packet)
                    in_transaction = not ev.gtid_standalone(packet)
                    if ev.gtid_prepared_xa(packet):  # MariaDB's XA START: the group is XA's
                        yield XaEvent("start", None, file, end, last)
                elif kind == ev.MYSQL_GTID:
                    self._gtid.seen(packet)
                elif kind in (ev.XID, ev.XA_PREPARE):
                    in_transaction = False
                    last = self._at(file, end)
                    yield Boundary(last, "commit")
                elif kind in (ev.QUERY, ev.EXECUTE_LOAD_QUERY):
                    records, framing = self._query(packet, fmt, kind, file, end, last)
                    yield from records
                    if framing == "begin":
                        in_transaction = True
                    elif framing == "end" or not in_transaction:
                        in_transaction = False
                        last = self._at(file, end)
                        yield Boundary(last, "commit")
                elif kind == ev.INCIDENT:
                    yield TableChange(
                        frozenset(self.tables),
                        "an INCIDENT event (the server lost events here)",
                        file,
                        end,
                    )
                elif kind not in ev.HARMLESS:
                    raise RunFailed(
                        f"{file}:{end} holds a binlog event of type {kind}, which this "
                        "Tidemark does not know: it stops rather than skip it (a newer "
                        "server feature?); check the event with mariadb-binlog/mysqlbinlog"
                    )
            if end and (index, end) == stop:
                break
        if self.stop is not None:
            yield Boundary(self.stop, "stop")

    def _query(
        self, packet: bytes, fmt: ev.Format, kind: int, file: str, end: int, last: BinlogPosition
    ) -> tuple[list[Record], Literal["begin", "end"] | None]:
        """What a QUERY event means for the chosen tables, and whether it opens or closes
        a transaction (``XA COMMIT``/``XA ROLLBACK`` of a prepared one close their own group)."""
        database, query = ev.query_event(packet, fmt, kind)
        framing = query.upper()
        if framing == "BEGIN":
            return [], "begin"
        if framing in ("COMMIT", "ROLLBACK"):
            return [], "end"
        from orchestrator.binlog.statement_parser import classify  # sqlglot: 70 ms, when needed

        mode = ev.query_sql_mode(packet, fmt, kind)
        statement = classify(
            query,
            database,
            lower_case_table_names=self._lower_case_table_names,
            ansi_quotes=bool(mode & ev.MODE_ANSI_QUOTES),
            backslash_escapes=not mode & ev.MODE_NO_BACKSLASH_ESCAPES,
        )
        if statement.kind == "xa" and statement.xa is not None:
            verb, xid = statement.xa
            step = {"START": "start", "END": "end", "COMMIT": "commit", "ROLLBACK": "rollback"}.get(
                verb
            )
            if step is None:
                return [], None
            record = XaEvent(step, xid, file, end, last)  # type: ignore[arg-type]
            return [record], "end" if step in ("commit", "rollback") else None
        if statement.kind in ("begin", "commit", "rollback", "other", "xa"):
            return [], None
        touched = frozenset(
            name for folded, name in self._folded.items() if statement.touches(folded)
        )
        if not touched:
            return [], None
        what = redacted(  # its literals may be data or passwords: shown without them
            query,
            ansi_quotes=bool(mode & ev.MODE_ANSI_QUOTES),
            backslash_escapes=not mode & ev.MODE_NO_BACKSLASH_ESCAPES,
        )
        what = what if len(what) <= 120 else what[:117] + "..."
        how = {
            "truncate": "TRUNCATE",
            "dml": "a statement-format change",
            "ddl": "DDL" if statement.parsed else "an unparsed statement",
        }[statement.kind]
        dml = statement.kind == "dml"
        return [TableChange(touched, f"{how} `{what}`", file, end, rows=dml)], None

    def _table_map(
        self, packet: bytes, fmt: ev.Format, maps: dict[int, ev.TableMap | None]
    ) -> tuple[str, str] | None:
        """Remember a TABLE_MAP; ``(table, how its shape differs)`` if it is not the planned one."""
        body = bytes(packet[ev.BODY : fmt.end(packet)])
        known = self._maps.get(body)
        if known is not None:
            maps[known.table_id] = known
            reshaped = self._reshaped.get(body)
            return (known.name, reshaped) if reshaped is not None else None
        name = self._folded.get(fold(ev.table_map_name(packet, fmt), self._lower_case_table_names))
        info = self.tables.get(name) if name is not None else None
        if info is None or name is None:
            maps[ev.table_id(packet, fmt, ev.TABLE_MAP)] = None
            return None
        table_map = ev.parse_table_map(packet, fmt)
        if table_map.name != name:  # the binlog's spelling of a case-insensitive name
            table_map = replace(table_map, name=name)
        if len(self._maps) > 1000:
            self._maps.clear()
            self._reshaped.clear()
        self._maps[body] = maps[table_map.table_id] = table_map
        difference = shape_difference(info, table_map) or metadata_difference(
            info, table_map, self._collations, mariadb="mariadb" in fmt.server_version.lower()
        )
        if difference is None:
            return None
        how = difference if info.versioned else f"a TABLE_MAP of another shape ({difference})"
        self._reshaped[body] = how
        return name, how

    def _rows(
        self,
        packet: bytes,
        fmt: ev.Format,
        kind: int,
        maps: Mapping[int, ev.TableMap | None],
        file: str,
        end: int,
    ) -> RowsEvent | TableChange | None:
        """A rows event of a chosen table; a `TableChange` (its table re-read from here) when
        its images do not hold every column (docs/design.md, "Changes that are not row
        images")."""
        table_map = maps.get(ev.table_id(packet, fmt, kind))
        if table_map is None:
            return None
        if kind == ev.PARTIAL_UPDATE_ROWS:
            return TableChange(frozenset({table_map.name}), PARTIAL_JSON, file, end, rows=True)
        rows = ev.rows_layout(packet, fmt, kind)
        if not rows.full:
            return TableChange(frozenset({table_map.name}), NOT_FULL, file, end, rows=True)
        return RowsEvent(table_map.name, ev.ROWS_OPS[kind], file, end, packet, rows, table_map, fmt)
