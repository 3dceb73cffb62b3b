"""A table to capture, and its buffered changes until they are written as a segment.

`orchestrator.pipeline.capture.step` keeps one `TableBuffer` per table of the run; the
segment columns are described there.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.binlog import versioned
from orchestrator.binlog.batch import Decoding
from orchestrator.binlog.reference import RowsEvent
from orchestrator.pipeline.capture.xa import XA_KNOWN
from orchestrator.pipeline.changes import META_COLUMNS, OLD_PREFIX, OP
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo
from orchestrator.schema.values import staging_schema, staging_type

#: The start of a table whose rows are no longer kept (it waits for a re-read, or failed).
NEVER = (1 << 62, 0, 0)


@dataclass(frozen=True, slots=True)
class CaptureTable:
    """A table to capture.

    Attributes:
        info: its shape, from ``information_schema`` when the run was planned.
        key: its chunk key; ``_tm_old_<c>`` columns carry the before image of these.
        start: changes at or before this position are not kept (its snapshot or
            published version already holds them).
        read_from: where its binlog is read from, when before ``start``: the run before held
            its next start back to where an XA transaction began, still prepared at that run's
            end (`orchestrator.pipeline.capture.xa`). From there the capture sees the
            transaction's group, to apply its rows at its commit; every change and every
            re-read cause of the table up to ``start`` (its published version's position) is
            in the version already, so none of them is kept or re-reads it again.
        where: its filter: changes leaving it delete (`orchestrator.pipeline.capture.filtering`).
        multiset: a table without a key (`orchestrator.pipeline.keyless`): ``key`` is every
            column, and its filter judges before and after images alike.
        before: more columns whose before image the cascade derivation reads (a parent's
            referenced columns outside its key; `orchestrator.pipeline.capture.derive`).
        published: False for a parent outside the run: its rows events are decoded for the
            cascades they derive, never written.
        held: the run before held ``start`` back for an XA transaction of other tables
            prepared at its end (`orchestrator.pipeline.capture.xa`).
        known: XA transactions prepared at ``start`` that hold nothing the capture decodes
            (`orchestrator.pipeline.capture.xa`, ``XA_KNOWN``): their commit changes nothing
            of the table.
        next_held: an earlier pass of this run's capture held its next start back (a pass
            after a re-read decides again).
    """

    info: TableInfo
    key: tuple[str, ...]
    start: BinlogPosition
    where: str | None = None
    multiset: bool = False
    before: tuple[str, ...] = ()
    published: bool = True
    held: bool = False
    next_held: bool = False
    read_from: BinlogPosition | None = None
    known: frozenset[str] = frozenset()

    @property
    def first(self) -> BinlogPosition:
        """Where the capture reads this table's binlog from."""
        return self.start if self.read_from is None else min(self.start, self.read_from)


class Starts(TypedDict):
    """`CaptureTable`'s ``start``, ``read_from``, ``held`` and ``known``."""

    start: BinlogPosition
    read_from: BinlogPosition | None
    held: bool
    known: frozenset[str]


def planned_starts(info: Mapping[str, Any], mode: str) -> Starts:
    """A planned table's `CaptureTable` ``start`` and ``read_from`` from its record's ``info``:
    ``from_position``, and for an incremental table held back before its published version
    (``version_position``, `orchestrator.pipeline.plan.tables`) that version's position; with
    what its published start says of XA transactions (``held_back``, ``xa_known``).

    >>> held = {"from_position": {"file": "b.000001", "pos": 400},
    ...         "version_position": {"file": "b.000001", "pos": 900}}
    >>> {k: str(v) for k, v in planned_starts(held, "incremental").items()}
    {'start': 'b.000001:900', 'read_from': 'b.000001:400', 'held': 'False', 'known': 'frozenset()'}
    >>> {k: str(v) for k, v in planned_starts(held, "snapshot").items()}
    {'start': 'b.000001:400', 'read_from': 'None', 'held': 'False', 'known': 'frozenset()'}
    """
    start = BinlogPosition.from_json(info["from_position"])
    known = frozenset(info.get(XA_KNOWN) or ())  # a table re-read inside the run keeps them
    if mode != "incremental":  # a snapshot's start is its own
        return Starts(start=start, read_from=None, held=False, known=known)
    version = info.get("version_position")
    held = bool(info.get("held_back"))
    if version is None:
        return Starts(start=start, read_from=None, held=held, known=known)
    return Starts(start=BinlogPosition.from_json(version), read_from=start, held=held, known=known)


def key_indexes(table: CaptureTable) -> list[int]:
    """The positions of the table's chunk-key columns among its columns."""
    names = [c.name for c in table.info.columns]
    return [names.index(table.info.column(k).name) for k in table.key]


def before_indexes(table: CaptureTable) -> list[int]:
    """The positions of every column whose before image is decoded: the key, then `before`."""
    names = [c.name for c in table.info.columns]
    key = key_indexes(table)
    return key + [
        i for i in (names.index(table.info.column(c).name) for c in table.before) if i not in key
    ]


@dataclass(frozen=True, slots=True)
class Drained:
    """What a buffer held, as Arrow: the segment's table, the before image of `before` columns
    (by name; the key's are the table's ``_tm_old_`` columns) and each row's event flags."""

    table: pa.Table
    before: dict[str, pa.Array]
    flags: Sequence[int]


class TableBuffer:
    """Buffered changes of one table and how to write them as a segment.

    Rows stay tuples (as the decoding gives them) until the segment is written;
    then each run of rows decoded under one TABLE_MAP shape becomes Arrow
    column by column.
    """

    def __init__(self, table: CaptureTable, decoding: Decoding) -> None:
        self.table = table
        self.decoding = decoding
        self.key_index = key_indexes(table)
        self.before_names = [
            table.info.columns[i].name for i in before_indexes(table)[len(self.key_index) :]
        ]
        self.clear()

    def clear(self) -> None:
        self.files: list[int] = []
        self.positions: list[int] = []
        self.rows: list[int] = []
        self.ops: list[str] = []
        self.images: list[tuple[Any, ...]] = []
        self.keys: list[tuple[Any, ...]] = []
        self.shapes: list[tuple[Hashable, int]] = []  # (shape, index of its first row)
        self.flags: list[int] = []

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """The segment's schema, made when the first segment is written: a capture of thousands
        of tables, most without a change, makes few (0.3 ms a table)."""
        meta = [
            pa.field(name, pa.string() if name == OP else pa.int64(), False)
            for name in META_COLUMNS
        ]
        old = [
            pa.field(
                f"{OLD_PREFIX}{self.table.info.columns[i].name}",
                staging_type(self.table.info.columns[i]),
                True,
            )
            for i in self.key_index
        ]
        return pa.schema([*meta, *staging_schema(self.table.info.columns), *old])

    def add(self, event: RowsEvent, file: int, first: int, base: int = 0) -> int:
        """Decode the event's rows from index ``first`` on (numbered from ``base``: the rows
        of an XA transaction all take its commit's position); returns how many were added."""
        shape, images, keys = self.decoding.rows(event)
        if first:
            images, keys = images[first:], keys[first:]
        count = len(images)
        if not self.shapes or self.shapes[-1][0] != shape:
            self.shapes.append((shape, len(self.images)))
        self.images += images
        self.keys += keys
        self.files += [file] * count
        self.positions += [event.end] * count
        self.rows += range(base + first, base + first + count)
        self.ops += [event.op] * count
        self.flags += [event.rows.flags] * count
        return count

    def __len__(self) -> int:
        return len(self.ops)

    def first_position(self) -> tuple[int, int] | None:
        """``(file index, position)`` of the first buffered change, None when none is."""
        return (self.files[0], self.positions[0]) if self.ops else None

    def counted(self) -> int:
        """Rows buffered since the last call whose count was not returned by `add` (none here:
        `add` decodes at once)."""
        return 0

    def to_arrow(self) -> pa.Table:
        """The buffered changes as the segment's table."""
        return self.drain().table

    def drain(self) -> Drained:
        """The buffered changes as Arrow (`Drained`); the buffer is left as it is."""
        ends = [start for _, start in self.shapes[1:]] + [len(self.images)]
        if len(self.shapes) == 1:
            data: list[pa.Array | pa.ChunkedArray] = self.decoding.arrays(
                self.shapes[0][0], self.images, self.keys
            )
        else:
            parts = [
                self.decoding.arrays(shape, self.images[start:end], self.keys[start:end])
                for (shape, start), end in zip(self.shapes, ends, strict=True)
            ]
            data = [pa.chunked_array([part[i] for part in parts]) for i in range(len(parts[0]))]
        meta = [
            pa.array(self.files, pa.int64()),
            pa.array(self.positions, pa.int64()),
            pa.array(self.rows, pa.int64()),
            pa.array(self.ops, pa.string()),
        ]
        return self.assemble(meta, data, self.flags)

    def assemble(self, meta: list[Any], data: list[Any], flags: Sequence[int]) -> Drained:
        """The `Drained` of the position columns ``meta`` and the decoded columns ``data``."""
        kept = len(self.table.info.columns) + len(self.key_index)
        table = pa.Table.from_arrays([*meta, *data[:kept]], schema=self.schema)
        before = dict(zip(self.before_names, data[kept:], strict=True))
        return Drained(table, before, flags)


class VersionedBuffer(TableBuffer):
    """`TableBuffer` of a system-versioned table (`orchestrator.binlog.versioned`): history rows
    left out, an update that ended a row's period a delete of its before image; the hidden
    period columns of a table that declares none are decoded (``decoding`` is made for
    `versioned.logged`'s shape), then dropped."""

    def __init__(self, table: CaptureTable, decoding: Decoding) -> None:
        super().__init__(table, decoding)
        self.end = versioned.end_index(table.info)
        self.hidden = len(versioned.logged(table.info).columns) - len(table.info.columns)
        self.before_at = before_indexes(table)

    def add(self, event: RowsEvent, file: int, first: int, base: int = 0) -> int:
        shape, images, keys = self.decoding.rows(event)
        ops = versioned.classify(event.op, [image[self.end] for image in images])
        kept = [i for i in range(first, len(images)) if ops[i] is not None]
        if not kept:
            return 0
        if not self.shapes or self.shapes[-1][0] != shape:
            self.shapes.append((shape, len(self.images)))
        for i in kept:
            image = images[i]
            if event.op == "U" and ops[i] == "D":  # the before image: the key's values are its
                row = list(image)
                for j, at in enumerate(self.before_at):
                    row[at] = keys[i][j]
                image = tuple(row)
            self.images.append(image)
            self.keys.append(keys[i])
        count = len(kept)
        self.files += [file] * count
        self.positions += [event.end] * count
        self.rows += [base + i for i in kept]
        self.ops += [ops[i] or "" for i in kept]
        self.flags += [event.rows.flags] * count
        return count

    def assemble(self, meta: list[Any], data: list[Any], flags: Sequence[int]) -> Drained:
        columns = len(self.table.info.columns)
        return super().assemble(meta, [*data[:columns], *data[columns + self.hidden :]], flags)


def since(
    own: pa.Table | None, start: tuple[int, int, int] | None, derived: pa.Table | None
) -> pa.Table:
    """A table's segment: its own changes after ``start`` (None: all of them; a parent's rows
    before its start were kept only for the cascades they derive) and its derived changes."""
    parts = [t for t in (own, derived) if t is not None]
    if own is not None and own.num_rows and start is not None:
        position = pc.add(pc.multiply(own.column("_tm_file"), 1 << 40), own.column("_tm_pos"))
        after = pc.or_(
            pc.greater(position, (start[0] << 40) + start[1]),
            pc.and_(
                pc.equal(position, (start[0] << 40) + start[1]),
                pc.greater(own.column("_tm_row"), start[2]),
            ),
        )
        if not pc.all(after).as_py():
            parts[0] = own.filter(after)
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables([parts[0], parts[1].cast(parts[0].schema)])
