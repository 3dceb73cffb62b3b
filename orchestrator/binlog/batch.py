"""A table's rows events -> row tuples -> Arrow columns: the capture's decoding strategy.

The capture buffers each table's changes as tuples and converts them to Arrow
a segment at a time. `Decoding` is what it needs from a decoder; `FastDecoding`
is Tidemark's (`rowdecode` + `columns`), and `orchestrator.binlog.reference.LibraryDecoding`
the python-mysql-replication reference. Both give the same arrays, value for value.

Rows decoded under one TABLE_MAP shape must be converted with that shape's
finishers (a DECIMAL's scale, a DATETIME's fsp), so `Decoding.rows` names the
shape it used and the capture converts each run of rows with its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from orchestrator.binlog.columns import Finisher, JsonParser, finisher
from orchestrator.binlog.rowdecode import Row, TableDecoder
from orchestrator.schema.tables import TableInfo

if TYPE_CHECKING:
    from orchestrator.binlog.reader import RowsEvent


class Decoding(Protocol):
    """How one table's rows events become rows, and rows become Arrow."""

    def rows(self, event: RowsEvent) -> tuple[Hashable, list[Row], list[Row]]:
        """``(shape, images, old keys)`` of the event's rows: the after image (a delete's
        before image) and the before image's chunk key (all None for an insert)."""
        ...

    def arrays(self, shape: Hashable, images: list[Row], keys: list[Row]) -> list[pa.Array]:
        """The table's columns, then the old-key columns, in staging types."""
        ...


def getter(indexes: Sequence[int]) -> Callable[[Row], Row]:
    """The function picking ``indexes`` out of a tuple, as a tuple (one index included)."""
    if len(indexes) == 1:
        only = indexes[0]
        return lambda row: (row[only],)
    return itemgetter(*indexes)


def column(rows: list[Row], index: int) -> list[Any]:
    """Column ``index`` of the rows (faster than ``zip(*rows)``: no iterator per row)."""
    return list(map(itemgetter(index), rows))


class _Shape:
    """The decoder of one TABLE_MAP shape and its finishers."""

    def __init__(
        self, info: TableInfo, event: RowsEvent, key: Sequence[int], parse_json: JsonParser
    ) -> None:
        self.decoder = TableDecoder(info, event.table_map, key)
        self.finishers: list[Finisher] = [
            finisher(c, f, parse_json)
            for c, f in zip(info.columns, self.decoder.fields, strict=True)
        ]
        self.key_finishers = [self.finishers[i] for i in key]


class FastDecoding:
    """Tidemark's decoding of one table's rows events.

    Args:
        info: the table as planned.
        key: indexes of its chunk-key columns.
        parse_json: MySQL's binary JSON parser (for JSON columns of MySQL sources).
    """

    def __init__(self, info: TableInfo, key: Sequence[int], parse_json: JsonParser) -> None:
        self.info = info
        self.key = tuple(key)
        self.key_of = getter(self.key)
        self.no_key: Row = (None,) * len(self.key)
        self.parse_json = parse_json
        self._shapes: dict[Hashable, _Shape] = {}

    def rows(self, event: RowsEvent) -> tuple[Hashable, list[Row], list[Row]]:
        signature = event.table_map.signature
        shape = self._shapes.get(signature)
        if shape is None:
            shape = self._shapes[signature] = _Shape(self.info, event, self.key, self.parse_json)
        decoder, layout = shape.decoder, event.rows
        if event.op == "U":
            keys, images = decoder.update_images(event.packet, layout.start, layout.end)
            return signature, images, keys
        images = decoder.images(event.packet, layout.start, layout.end)
        if event.op == "I":
            return signature, images, [self.no_key] * len(images)
        return signature, images, list(map(self.key_of, images))

    def arrays(self, shape: Hashable, images: list[Row], keys: list[Row]) -> list[pa.Array]:
        known = self._shapes[shape]
        return [
            *(f(column(images, i)) for i, f in enumerate(known.finishers)),
            *(f(column(keys, i)) for i, f in enumerate(known.key_finishers)),
        ]
