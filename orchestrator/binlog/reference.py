"""python-mysql-replication's decoding of the binlog: the only module importing it.

`BinlogReader` frames the stream with Tidemark's own reader
(`orchestrator.binlog.reader.EventReader`: positions, boundaries,
rotation, stop) and decodes the rows of each rows event with the library,
yielding one `RowChange` per row. The capture decodes with
`orchestrator.binlog` instead; this path is the reference it is tested
against value for value (`LibraryDecoding`), and the baseline of the benchmark.

Values come out as plain Python values in the table's column order (the
`TableInfo` from ``information_schema``, not the library's idea of the table);
`orchestrator.schema.values` turns them into Arrow. Where the library decodes a type
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
the methods exist. The library's events are built from the raw packets the
reader hands over (``BinLogPacketWrapper``), so both decoders see the same bytes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pymysql.protocol import MysqlPacket
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)
from pymysqlreplication.row_event import RowsEvent as _LibraryRowsEvent

from orchestrator.binlog import events as ev
from orchestrator.binlog.batch import getter
from orchestrator.binlog.jsonb import json_text
from orchestrator.binlog.reader import Boundary, EventReader, Op, RowsEvent, TableChange, XaEvent
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import ColumnInfo, TableInfo
from orchestrator.schema.values import BatchConverter, definition_labels, time2_from_bytes
from orchestrator.source.dialect import Dialect

__all__ = [
    "BinlogReader",
    "Boundary",
    "LibraryDecoding",
    "Record",
    "RowChange",
    "RowsEvent",
    "TableChange",
]

Image = tuple[Any, ...]

_EPOCH = dt.datetime(1970, 1, 1)
_UINT32_SECONDS = dt.timedelta(seconds=1 << 32)


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


Record = RowChange | Boundary | TableChange | XaEvent


# --------------------------------------------------------------------------- library fixes


def _read_raw_string(self: Any, size: int, column: Any) -> bytes:
    """Strings stay bytes: `orchestrator.schema.values` decodes them with the column's charset."""
    raw: bytes = self.packet.read_length_coded_pascal_string(size)
    return raw


def _read_time2(self: Any, column: Any) -> dt.timedelta:
    """TIME(fsp), negative values with fractions included (the library gets those wrong)."""
    return time2_from_bytes(self.packet.read(3 + (column.fsp + 1) // 2), column.fsp)


def _read_binary_json(self: Any, size: int, is_partial: bool) -> str | None:
    """MySQL's binary JSON as the server prints it (`orchestrator.binlog.jsonb`): the library
    makes Python values of it that print otherwise (doubles, DECIMAL, temporal values)."""
    if is_partial:
        raise ValueError("a partial JSON update; set binlog_row_value_options='' on the source")
    length = self.read_uint_by_size(size)
    return json_text(self.read(length)) if length else None


def _install_fixes() -> None:
    for cls, name, fix in (
        (_LibraryRowsEvent, "_RowsEvent__read_string", _read_raw_string),
        (_LibraryRowsEvent, "_RowsEvent__read_time2", _read_time2),
        (BinLogPacketWrapper, "read_binary_json", _read_binary_json),
    ):
        current = getattr(cls, name, None)
        if current is None:
            raise ImportError(
                f"python-mysql-replication changed: {cls.__name__}.{name} is "
                "gone; pin mysql-replication to the 1.0 series"
            )
        if current is not fix:
            setattr(cls, name, fix)


_install_fixes()


# --------------------------------------------------------------------------- library decoding


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
        """Give the library our column metadata (names, signedness, ENUM/SET labels)."""
        for column, ours in zip(library_columns, self.info.columns, strict=True):
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


class _Control:
    """What the library's events ask of their control connection (nothing is queried)."""

    charset = "utf8mb4"

    def __init__(self, dbms: str) -> None:
        self.dbms = dbms

    def _get_dbms(self) -> str:
        return self.dbms


_LIBRARY_EVENTS = frozenset({TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent})


class LibraryRows:
    """python-mysql-replication's decoding of `RowsEvent`s, in `TableInfo` column order.

    Args:
        tables: the tables the events may belong to.
    """

    def __init__(self, tables: Mapping[str, TableInfo]) -> None:
        self._decoders = {name: _TableDecoder(info) for name, info in tables.items()}
        self._tables: dict[ev.TableMap, Any] = {}

    def _event(self, packet: bytes, fmt: ev.Format, table_map: dict[int, Any]) -> Any:
        dbms = Dialect.from_version(fmt.server_version).flavor
        wrapper = BinLogPacketWrapper(
            from_packet=MysqlPacket(packet, "utf8"),
            table_map=table_map,
            ctl_connection=_Control(dbms),
            mysql_version=(0, 0, 0),
            use_checksum=fmt.checksum > 0,
            allowed_events=_LIBRARY_EVENTS,
            only_tables=None,
            ignored_tables=None,
            only_schemas=None,
            ignored_schemas=None,
            freeze_schema=False,
            ignore_decode_errors=False,
            verify_checksum=False,
            optional_meta_data=False,
            enable_logging=False,
            post_header_lengths=tuple(fmt.post_headers),
        )
        return wrapper.event

    def _library_table(self, event: RowsEvent) -> Any:
        table = self._tables.get(event.table_map)
        if table is None:
            if len(self._tables) > 1000:
                self._tables.clear()
            table = self._event(event.table_map.packet, event.format, {}).get_table()
            self._decoders[event.table].adopt(table.columns)
            self._tables[event.table_map] = table
        return table

    def rows(self, event: RowsEvent) -> list[tuple[Image | None, Image | None]]:
        """``(after, before)`` images of each row of the event."""
        table = self._library_table(event)
        decoded = self._event(event.packet, event.format, {event.table_map.table_id: table})
        image = self._decoders[event.table].image
        if event.op == "U":
            return [
                (
                    image(r["after_values"], r["after_none_sources"]),
                    image(r["before_values"], r["before_none_sources"]),
                )
                for r in decoded.rows
            ]
        if event.op == "I":
            return [(image(r["values"], r["none_sources"]), None) for r in decoded.rows]
        return [(None, image(r["values"], r["none_sources"])) for r in decoded.rows]

    def changes(self, event: RowsEvent) -> Iterator[RowChange]:
        for i, (after, before) in enumerate(self.rows(event)):
            yield RowChange(
                event.table, event.op, BinlogPosition(event.file, event.end, i), after, before
            )


class LibraryDecoding:
    """The library's decoding of one table's rows events, as a `orchestrator.binlog.batch.Decoding`.

    Args:
        info: the table as planned.
        key: indexes of its chunk-key columns.
        library: the decoder shared by the capture's tables.
    """

    def __init__(self, info: TableInfo, key: Sequence[int], library: LibraryRows) -> None:
        self.library = library
        self.converter = BatchConverter(info.columns)
        self.key_converter = BatchConverter([info.columns[i] for i in key])
        self.key_of = getter(key)
        self.no_key: Image = (None,) * len(key)

    def rows(self, event: RowsEvent) -> tuple[Hashable, list[Image], list[Image]]:
        images, keys = [], []
        for after, before in self.library.rows(event):
            image = after if after is not None else before
            assert image is not None
            images.append(image)
            keys.append(self.no_key if before is None else self.key_of(before))
        return None, images, keys

    def arrays(self, shape: Hashable, images: list[Image], keys: list[Image]) -> list[pa.Array]:
        return [*self.converter.arrays(images), *self.key_converter.arrays(keys)]


# --------------------------------------------------------------------------- the reader


class BinlogReader(EventReader):
    """Row changes of some tables between two binlog positions, decoded by the library.

    Iterating connects (non-blocking: the stream ends where the binlog ends),
    yields `RowChange`, `TableChange` and `Boundary` records in binlog order, and closes
    (a table's rows after a `TableChange` of it are left out: they need a re-read);
    `events` (from `EventReader`) yields the rows events undecoded instead.
    Its arguments are `EventReader`'s.
    """

    def __iter__(self) -> Iterator[Record]:
        library = LibraryRows(self.tables)
        changed: set[str] = set()
        for record in self.events():
            if isinstance(record, RowsEvent):
                if record.table not in changed:
                    yield from library.changes(record)
            else:
                if isinstance(record, TableChange):
                    changed |= record.tables
                yield record
