"""A small typed adapter over python-mysql-replication: the only module that imports it.

`BinlogReader` streams the row changes of chosen tables from a start position
up to a stop position, as `RowChange` records, interleaved with `Boundary`
records at transaction ends (the only safe places to resume a stream: resuming
in the middle of a transaction loses its TABLE_MAP events).

Values come out as plain Python values in the table's column order (the
`TableInfo` from ``information_schema``, not the library's idea of the table);
`orchestrator.values` turns them into Arrow. Where the library decodes a type
differently from what ``SELECT`` returns, the adapter fixes it here:

* strings stay raw bytes (decoded later with the column's charset: the
  library's own decoding fails on latin1 bytes such as 0x81);
* negative TIME values with fractional seconds are decoded from the on-disk
  format (the library gets them wrong);
* YEAR 0000 is 0 (not 1900), an empty SET is an empty set (not NULL), BIT is an
  int, TIMESTAMP is an aware UTC datetime (zero -> None) independent of ``TZ``;
* ENUM/SET labels, names and signedness are taken from `TableInfo`, so decoding
  does not depend on ``binlog_row_metadata``.

The first two replace two private methods of the library's ``RowsEvent`` (once,
on import); the version is pinned to 1.x in setup.cfg and the patch checks that
the methods exist. Events the library would drop or half-decode (MariaDB's
compressed rows events, MySQL's partial JSON updates) and a lost connection
(which the library would silently resume mid-transaction) fail the read instead.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    MariadbGtidEvent,
    NotImplementedEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    PartialUpdateRowsEvent,
    RowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from orchestrator.config import SourceConfig
from orchestrator.errors import BinlogPurged, RunFailed
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.schema import ColumnInfo, TableInfo
from orchestrator.values import definition_labels, time2_from_bytes

log = logging.getLogger(__name__)

Op = Literal["I", "U", "D"]
Image = tuple[Any, ...]

_EPOCH = dt.datetime(1970, 1, 1)
_UINT32_SECONDS = dt.timedelta(seconds=1 << 32)
_MARIADB_FL_STANDALONE = 0x01
#: MariaDB's compressed rows events (log_bin_compress=ON), which the library cannot decode.
_COMPRESSED_ROWS_EVENTS = frozenset(range(166, 172))


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row changed by one rows event.

    Attributes:
        table: ``database.table``.
        op: ``I`` insert, ``U`` update, ``D`` delete.
        position: end of the rows event, and the row's index within it.
        after: the row after the change, in column order (None for a delete).
        before: the row before the change (None for an insert).
    """

    table: str
    op: Op
    position: BinlogPosition
    after: Image | None
    before: Image | None

    @property
    def image(self) -> Image:
        """The after image, or for a delete the before image."""
        image = self.after if self.after is not None else self.before
        assert image is not None
        return image


@dataclass(frozen=True, slots=True)
class Boundary:
    """A place where no transaction is open: a stream may resume from ``position``.

    ``kind`` is ``commit`` (end of an XID/COMMIT/DDL event), ``rotate`` (start of
    the next binlog file) or ``stop`` (the stop position was reached).
    """

    position: BinlogPosition
    kind: Literal["commit", "rotate", "stop"]


Record = RowChange | Boundary


# --------------------------------------------------------------------------- library fixes


def _read_raw_string(self: Any, size: int, column: Any) -> bytes:
    """Strings stay bytes: `orchestrator.values` decodes them with the column's charset."""
    raw: bytes = self.packet.read_length_coded_pascal_string(size)
    return raw


def _read_time2(self: Any, column: Any) -> dt.timedelta:
    """TIME(fsp), negative values with fractions included (the library gets those wrong)."""
    return time2_from_bytes(self.packet.read(3 + (column.fsp + 1) // 2), column.fsp)


def _install_fixes() -> None:
    for name, fix in (("_RowsEvent__read_string", _read_raw_string),
                      ("_RowsEvent__read_time2", _read_time2)):
        current = getattr(RowsEvent, name, None)
        if current is None:
            raise ImportError(f"python-mysql-replication changed: RowsEvent.{name} is gone; "
                              "pin mysql-replication to the 1.0 series")
        if current is not fix:
            setattr(RowsEvent, name, fix)


_install_fixes()


# --------------------------------------------------------------------------- table decoding

#: information_schema DATA_TYPE -> the binlog field types it can appear as.
_FIELD_TYPES: dict[str, frozenset[int]] = {
    data_type: frozenset(getattr(FIELD_TYPE, name) for name in names.split())
    for data_types, names in (
        ("tinyint", "TINY"), ("smallint", "SHORT"), ("mediumint", "INT24"),
        ("int integer", "LONG"), ("bigint", "LONGLONG"), ("decimal numeric", "NEWDECIMAL"),
        ("float", "FLOAT"), ("double real", "DOUBLE"), ("bit", "BIT"), ("year", "YEAR"),
        ("char binary", "STRING"), ("varchar varbinary", "VARCHAR VAR_STRING"),
        ("enum", "ENUM"), ("set", "SET"), ("date", "DATE NEWDATE"),
        ("datetime", "DATETIME DATETIME2"), ("timestamp", "TIMESTAMP TIMESTAMP2"),
        ("time", "TIME TIME2"), ("json", "JSON BLOB"),
        ("tinytext text mediumtext longtext tinyblob blob mediumblob longblob",
         "BLOB TINY_BLOB MEDIUM_BLOB LONG_BLOB"),
    )
    for data_type in data_types.split()
}


def _timestamp(value: dt.datetime) -> dt.datetime | None:
    """The library's naive-UTC TIMESTAMP as an aware instant; the zero value is None."""
    if value == _EPOCH:
        return None
    if value < _EPOCH:  # read as signed 32 bits; MariaDB 11.5+ stores up to 2106
        value += _UINT32_SECONDS
    return value.replace(tzinfo=dt.UTC)


def _fixer(column: ColumnInfo) -> Callable[[Any], Any] | None:
    """Per-type fix of a non-NULL library value (None: keep it)."""
    t = column.data_type
    if t == "year":
        return lambda v: 0 if v == 1900 else v  # the library adds 1900 to the stored byte
    if t == "timestamp":
        return _timestamp
    if t == "bit":
        return lambda v: int(v, 2) if isinstance(v, str) else v
    return None


class _TableDecoder:
    """Turns the library's row dicts of one table into tuples in `TableInfo` column order."""

    def __init__(self, info: TableInfo) -> None:
        self.info = info
        self.names = [c.name for c in info.columns]
        self.fixes = [(i, f) for i, c in enumerate(info.columns) if (f := _fixer(c)) is not None]
        self.sets = [i for i, c in enumerate(info.columns) if c.data_type == "set"]

    def adopt(self, library_columns: list[Any]) -> None:
        """Check a TABLE_MAP against `TableInfo` and give the library our column metadata.

        Raises:
            RunFailed: the table in the binlog does not have the planned shape.
        """
        info = self.info
        if len(library_columns) != len(info.columns):
            raise RunFailed(
                f"table {info.name} has {len(library_columns)} columns in the binlog but "
                f"{len(info.columns)} when the run was planned; its shape changed during the run: "
                f"re-snapshot it (tidemark run --table {info.name} --snapshot)")
        for column, ours in zip(library_columns, info.columns, strict=True):
            expected = _FIELD_TYPES.get(ours.data_type)
            if expected is not None and column.type not in expected:
                raise RunFailed(
                    f"column `{ours.name}` of {info.name} is {ours.column_type} in "
                    "information_schema but has another type in the binlog; the table changed "
                    f"during the run: re-snapshot it (tidemark run --table {info.name} --snapshot)")
            column.name = ours.name
            column.unsigned = ours.unsigned
            if ours.data_type == "enum":
                column.enum_values = ["", *definition_labels(ours.column_type)]
            elif ours.data_type == "set":
                column.set_values = list(definition_labels(ours.column_type))

    def image(self, values: dict[str, Any], none_sources: dict[str, str]) -> Image:
        row = list(values.values())
        for i, fix in self.fixes:
            if row[i] is not None:
                row[i] = fix(row[i])
        for i in self.sets:
            if row[i] is None and none_sources.get(self.names[i]) == "empty set":
                row[i] = frozenset()
        return tuple(row)


# --------------------------------------------------------------------------- the reader

_ROW_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)
_EVENTS = [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, PartialUpdateRowsEvent,
           TableMapEvent, XidEvent, XAPrepareEvent, QueryEvent, RotateEvent,
           FormatDescriptionEvent, MariadbGtidEvent, NotImplementedEvent]


class BinlogReader:
    """Row changes of some tables between two binlog positions.

    Iterating connects (non-blocking: the stream ends where the binlog ends),
    yields `RowChange` and `Boundary` records in binlog order, and closes.

    Args:
        source: the source's connection settings.
        password: its password.
        start: a transaction boundary (``SHOW MASTER STATUS`` or a `Boundary`) to read from.
        tables: the tables to keep, ``{"db.table": TableInfo}``; others are skipped.
        stop: the last position to read (a boundary); None reads to the end of the binlog.
        server_id: the replica id to connect as (default ``source.server_id``).
    """

    def __init__(self, source: SourceConfig, password: str, start: BinlogPosition,
                 tables: Mapping[str, TableInfo], *, stop: BinlogPosition | None = None,
                 server_id: int | None = None) -> None:
        self.source = source
        self.start = start
        self.stop = stop
        self.server_id = server_id if server_id is not None else source.server_id
        self._password = password
        self._decoders = {name: _TableDecoder(info) for name, info in tables.items()}
        self._stream: BinLogStreamReader | None = None
        self._stream_connections = 0

    def __enter__(self) -> BinlogReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    @property
    def address(self) -> str:
        return f"{self.source.host}:{self.source.port}"

    def _settings(self) -> dict[str, Any]:
        return {"host": self.source.host, "port": self.source.port, "user": self.source.user,
                "password": self._password, "connect_timeout": self.source.connect_timeout,
                "charset": "utf8mb4"}

    def _connect(self, **settings: Any) -> pymysql.connections.Connection[Any]:
        """The library's connection factory; refuses a silent stream reconnect.

        After a lost connection the library would reconnect at the last event's
        position, possibly inside a transaction whose TABLE_MAP it then never sees
        (and would drop that transaction's rows). Failing lets the caller resume
        from its last boundary instead.
        """
        if "db" not in settings:  # the stream connection (the control one names information_schema)
            self._stream_connections += 1
            if self._stream_connections > 1:
                raise RunFailed(f"lost the binlog connection to {self.address}; "
                                "a rerun resumes the capture from its last checkpoint")
        return pymysql.connect(**settings)

    def check_available(self) -> None:
        """Fail early when the binlog needed is gone or the stop lies beyond the binlog.

        Raises:
            BinlogPurged: ``start.file`` is no longer on the server.
            RunFailed: ``stop`` is after the server's current position.
        """
        conn = pymysql.connect(**self._settings())
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                files = [str(row[0]) for row in cur.fetchall()]
                try:
                    cur.execute("SHOW MASTER STATUS")
                except pymysql.err.ProgrammingError:  # MySQL 8.4 has only the new name
                    cur.execute("SHOW BINARY LOG STATUS")
                status = cur.fetchone()
        finally:
            conn.close()
        if self.start.file not in files:
            oldest = files[0] if files else "(none)"
            raise BinlogPurged(
                f"binlog file {self.start.file} (needed from {self.start}) is no longer on "
                f"{self.address}; the oldest binlog there is {oldest}. Changes since {self.start} "
                "are lost to this run: the chunks read before it must be read again, and keep "
                "binlogs longer (binlog_expire_logs_seconds / expire_logs_days)")
        if self.stop is not None and status is not None:
            current = BinlogPosition(str(status[0]), int(status[1]))
            if self.stop > current:
                raise RunFailed(f"stop position {self.stop} is after the binlog end {current} "
                                f"on {self.address}; was the server's binlog reset?")

    def _open(self) -> BinLogStreamReader:
        names = [n.split(".", 1) for n in self._decoders]
        return BinLogStreamReader(
            connection_settings=self._settings(), server_id=self.server_id,
            log_file=self.start.file, log_pos=self.start.pos, resume_stream=True,
            blocking=False, only_events=_EVENTS,
            only_schemas=sorted({db for db, _ in names}), only_tables=sorted({t for _, t in names}),
            filter_non_implemented_events=False, pymysql_wrapper=self._connect,
            enable_logging=False)

    def __iter__(self) -> Iterator[Record]:
        self.check_available()
        log.info("binlog of %s: reading %s to %s for %d table(s)", self.address, self.start,
                 self.stop or "its end", len(self._decoders))
        self._stream = stream = self._open()
        try:
            yield from self._records(stream)
        finally:
            self.close()

    def _compare_stop(self, file: str, end: int) -> int:
        """-1, 0 or 1 as the event ending at ``file:end`` is before, at or after the stop."""
        stop = self.stop
        if stop is None:
            return -1
        here, there = (file_index(file), end), (file_index(stop.file), stop.pos)
        return (here > there) - (here < there)

    def _records(self, stream: BinLogStreamReader) -> Iterator[Record]:
        file = self.start.file
        in_transaction = False
        for event in stream:
            end = int(event.packet.log_pos)  # 0 for the fake events sent on connecting
            if isinstance(event, FormatDescriptionEvent):
                continue
            if end and self._compare_stop(file, end) > 0:
                break
            if isinstance(event, RotateEvent):
                stream.table_map.clear()  # table ids are reused after a server restart
                file = event.next_binlog
                if end:
                    yield Boundary(BinlogPosition(file, int(event.position)), "rotate")
                continue
            if isinstance(event, TableMapEvent):
                self._adopt(event, stream)
            elif isinstance(event, _ROW_EVENTS):
                yield from self._changes(event, file, end)
            elif isinstance(event, PartialUpdateRowsEvent | NotImplementedEvent):
                _refuse_unreadable(event, file, end)
            elif isinstance(event, MariadbGtidEvent):
                in_transaction = not event.flags & _MARIADB_FL_STANDALONE
            elif isinstance(event, XidEvent | XAPrepareEvent):
                in_transaction = False
                yield Boundary(BinlogPosition(file, end), "commit")
            elif isinstance(event, QueryEvent):
                query = _query_text(event)
                if query == "BEGIN":
                    in_transaction = True
                elif query in ("COMMIT", "ROLLBACK") or not in_transaction:
                    in_transaction = False
                    yield Boundary(BinlogPosition(file, end), "commit")
            if end and self._compare_stop(file, end) == 0:
                break
        if self.stop is not None:
            yield Boundary(self.stop, "stop")

    def _adopt(self, event: Any, stream: BinLogStreamReader) -> None:
        decoder = self._decoders.get(f"{event.schema}.{event.table}")
        if decoder is not None:
            decoder.adopt(stream.table_map[event.table_id].columns)

    def _changes(self, event: Any, file: str, end: int) -> Iterator[RowChange]:
        table = f"{event.schema}.{event.table}"
        decoder = self._decoders.get(table)
        if decoder is None:
            return
        image = decoder.image
        if isinstance(event, UpdateRowsEvent):
            for i, row in enumerate(event.rows):
                yield RowChange(table, "U", BinlogPosition(file, end, i),
                                image(row["after_values"], row["after_none_sources"]),
                                image(row["before_values"], row["before_none_sources"]))
        elif isinstance(event, WriteRowsEvent):
            for i, row in enumerate(event.rows):
                yield RowChange(table, "I", BinlogPosition(file, end, i),
                                image(row["values"], row["none_sources"]), None)
        else:
            for i, row in enumerate(event.rows):
                yield RowChange(table, "D", BinlogPosition(file, end, i), None,
                                image(row["values"], row["none_sources"]))


def _refuse_unreadable(event: Any, file: str, end: int) -> None:
    """Fail on row events the library would skip or decode partially (never lose rows silently)."""
    if isinstance(event, PartialUpdateRowsEvent):
        raise RunFailed(f"{file}:{end} holds a partial JSON update; set "
                        "binlog_row_value_options='' on the source so row images are full")
    if event.event_type in _COMPRESSED_ROWS_EVENTS:
        raise RunFailed(f"{file}:{end} holds a compressed rows event, which Tidemark cannot read; "
                        "set log_bin_compress=OFF on the source and re-snapshot the run's tables")


def _query_text(event: Any) -> str:
    query = event.query
    text = query.decode("utf-8", "replace") if isinstance(query, bytes) else str(query)
    return text.strip().upper()
