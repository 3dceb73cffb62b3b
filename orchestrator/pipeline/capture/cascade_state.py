"""A child table's rows as the cascade derivation sees them at a binlog position.

`orchestrator.pipeline.capture.derive` needs, at each parent change, which rows of a child
reference the parent's old values, and those rows' full images. A `TableState` answers from the
table's *base* - its published version (an incremental table: the table exactly at its start
position) or the run's chunk files (a snapshot) - overlaid by its changes since its start, its
own and derived, in binlog order. The base is read column by column when first needed (the
key, the foreign-key and referenced columns: a few narrow columns, never a re-read of the
source), and a full row only for the rows a ``SET NULL`` or ``ON UPDATE CASCADE`` rewrites.
Changes already written (a resumed capture, an earlier round) are read back from the run's
durable segments, so the state is the same however often the capture was interrupted.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.lake import storage
from orchestrator.pipeline.changes import OLD_PREFIX, OP
from orchestrator.schema.cascades import ForeignKey, pads
from orchestrator.schema.tables import TableInfo

Key = tuple[Any, ...]
#: Column name -> value, as the lake holds it (staging values).
Values = dict[str, Any]
#: Where a row's full image is: a file and a row index in it, or an Arrow table in memory.
RowRef = tuple[str | pa.Table, int]


@dataclass(frozen=True, slots=True)
class BaseSpec:
    """Where a table's base rows are.

    Attributes:
        files: the data files (the published version's, or the run's chunk files).
        complete: the position from which every row the table has at the source is known exactly
            (`TableState.complete`): the start of an incremental table (its version's position
            when later: a start held back for an XA transaction), the last read's high position
            of a snapshot; None when never (a table with a ``where`` filter).
    """

    files: list[str]
    complete: tuple[int, int, int] | None


def read_file(uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file (some of its columns), wherever it is stored."""
    fs, path = storage.filesystem(uri)
    return pq.read_table(path, filesystem=fs, columns=list(columns) if columns else None)


@functools.lru_cache(maxsize=8)
def _whole(uri: str) -> pa.Table:
    """A file read whole, for the full rows derived images start from (a few files at a time)."""
    return read_file(uri)


def _row(source: str | pa.Table, index: int) -> Values:
    table = _whole(source) if isinstance(source, str) else source
    return dict(table.slice(index, 1).to_pylist()[0])


class Base:
    """A table's base rows, read lazily: the columns the derivation needs, then full rows."""

    def __init__(self, files: Sequence[str], needed: Sequence[str]) -> None:
        self.files = list(files)
        self.needed = list(needed)
        self._arrays: dict[str, pa.Array] | None = None
        self._numbers: dict[str, np.ndarray] = {}  # integer columns as numpy, when asked for
        self._starts: list[int] = []  # the first row index of each file

    @property
    def arrays(self) -> dict[str, pa.Array]:
        """The needed columns of every base row, in file order."""
        if self._arrays is None:
            parts = [read_file(f, self.needed) for f in self.files]
            self._starts, total = [], 0
            for part in parts:
                self._starts.append(total)
                total += part.num_rows
            whole = pa.concat_tables(parts) if parts else None
            self._arrays = {
                c: whole.column(c).combine_chunks() if whole is not None else pa.array([])
                for c in self.needed
            }
        return self._arrays

    def values(self, indexes: Sequence[int]) -> dict[str, list[Any]]:
        """The needed columns of the base rows ``indexes``, as Python values (one conversion per
        column: an Arrow scalar per value costs ten times more)."""
        out = {}
        for column, array in self.arrays.items():
            if pa.types.is_integer(array.type) and array.null_count == 0:
                numbers = self._numbers.get(column)
                if numbers is None:
                    numbers = self._numbers[column] = array.to_numpy()
                out[column] = numbers[list(indexes)].tolist()
            else:
                out[column] = array.take(pa.array(indexes, pa.int64())).to_pylist()
        return out

    def row(self, index: int) -> Values:
        """The full base row ``index``."""
        self.arrays  # noqa: B018 (reads the files' row counts)
        file = bisect.bisect_right(self._starts, index) - 1
        return _row(self.files[file], index - self._starts[file])


class _Index:
    """Base rows by the values of some columns: a sorted integer column searched with numpy (one
    integer column, the common foreign key), else a dict of value tuples."""

    def __init__(self, columns: Sequence[pa.Array], norms: Sequence[Callable[[Any], Any]]) -> None:
        self.sorted: np.ndarray | None = None
        self.order: np.ndarray | None = None
        self.rows: dict[Key, list[int]] = {}
        if len(columns) == 1 and pa.types.is_integer(columns[0].type):
            column = columns[0]
            values = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            order = np.argsort(values, kind="stable")
            self.order = order[valid[order]]
            self.sorted = values[self.order]
            return
        lists = [c.to_pylist() for c in columns]
        for i, raw in enumerate(zip(*lists, strict=True)):
            if any(v is None for v in raw):
                continue
            self.rows.setdefault(tuple(n(v) for n, v in zip(norms, raw, strict=True)), []).append(i)

    def get(self, key: Key) -> list[int]:
        if self.sorted is None or self.order is None:
            return self.rows.get(key, [])
        value = key[0]
        if not isinstance(value, int):
            return []
        low = int(np.searchsorted(self.sorted, value, side="left"))
        high = int(np.searchsorted(self.sorted, value, side="right"))
        return [int(i) for i in self.order[low:high]]


@dataclass(slots=True)
class _Entry:
    """A row's state since the table's start: its needed values (None: deleted) and where its
    full image is (None: ``values`` is the full image, a derived row's)."""

    values: Values | None
    ref: RowRef | None = None


@dataclass
class TableState:
    """One child table's rows at the derivation's current position.

    Args:
        info: the table's shape.
        key: its chunk key.
        fks: the cascading keys it is the child of.
        needed: the columns the derivation reads of its rows (key, foreign-key and referenced).
        base: its base rows.
        complete: `BaseSpec.complete`.
    """

    info: TableInfo
    key: tuple[str, ...]
    fks: Sequence[ForeignKey]
    needed: Sequence[str]
    base: Base
    complete: tuple[int, int, int] | None
    overlay: dict[Key, _Entry] = field(default_factory=dict)
    _by_fk: dict[str, dict[Key, set[Key]]] = field(default_factory=dict)  # overlay rows by value
    _base_by_fk: dict[str, _Index] = field(default_factory=dict)
    _base_rows: dict[Key, tuple[int, Values]] = field(default_factory=dict)  # base members found

    def __post_init__(self) -> None:
        padded = {c.name for c in self.info.columns if pads(c)}
        self._norm: dict[str, Callable[[Any], Any]] = {
            c: (_rstrip if c in padded else _same) for c in self.needed
        }
        # Whether a full row may be asked for (a rule that rewrites rows): only then does a row's
        # entry keep where its full image is (the Arrow table of its flush stays in memory).
        self.rewrites = any(
            fk.action("U") is not None or fk.on_delete == "SET NULL" for fk in self.fks
        )

    def fk_values(self, fk: ForeignKey, values: Values) -> Key | None:
        """A row's values of ``fk``'s columns as they compare (None if any is NULL: no match)."""
        found = tuple(self._norm.get(c, _same)(values.get(c)) for c in fk.columns)
        return None if any(v is None for v in found) else found

    def normalized(self, fk: ForeignKey, values: Key) -> Key:
        """Values of ``fk``'s columns as they compare (text under a PAD SPACE collation without
        its trailing spaces)."""
        return tuple(self._norm.get(c, _same)(v) for c, v in zip(fk.columns, values, strict=True))

    def key_of(self, values: Values) -> Key:
        return tuple(values[k] for k in self.key)

    # ------------------------------------------------------------------ changes

    def load(self, segment: pa.Table, ref: str | pa.Table) -> None:
        """Apply a segment's changes (its rows in position order) to the overlay."""
        if segment.num_rows == 0:
            return
        indexes = _order_indexes(segment)
        columns = {c: segment.column(c).to_pylist() for c in self.needed}
        olds = {k: segment.column(OLD_PREFIX + k).to_pylist() for k in self.key}
        ops = segment.column(OP).to_pylist()
        for i in indexes:
            values = {c: columns[c][i] for c in self.needed}
            old = tuple(olds[k][i] for k in self.key)
            self.own(ops[i], values, old, (ref, i))

    def own(self, op: str, values: Values, old: Key, ref: RowRef) -> None:
        """One of the table's own changes (or a derived one read back from a segment)."""
        key = self.key_of(values)
        if op == "D":
            self.set(key, None)
            if old != key and any(v is not None for v in old):
                self.set(old, None)
            return
        if op == "U" and old != key:
            self.set(old, None)
        self.set(key, values, ref if self.rewrites else None)

    def set(self, key: Key, values: Values | None, ref: RowRef | None = None) -> None:
        """The row of ``key`` is now ``values`` (None: deleted)."""
        before = self.overlay.get(key)
        if before is not None and before.values is not None:
            for fk in self.fks:
                found = self.fk_values(fk, before.values)
                if found is not None:
                    self._by_fk.setdefault(fk.name, {}).get(found, set()).discard(key)
        self.overlay[key] = _Entry(values, ref)
        if values is not None:
            for fk in self.fks:
                found = self.fk_values(fk, values)
                if found is not None:
                    self._by_fk.setdefault(fk.name, {}).setdefault(found, set()).add(key)

    # ------------------------------------------------------------------ questions

    def members(self, fk: ForeignKey, referenced: Key) -> list[Key]:
        """The keys of the rows whose ``fk`` columns hold ``referenced`` now."""
        found = set(self._by_fk.get(fk.name, {}).get(referenced, set()))
        indexes = self._base_index(fk).get(referenced)
        if indexes:
            columns = self.base.values(indexes)
            for i, index in enumerate(indexes):
                values = {c: v[i] for c, v in columns.items()}
                key = self.key_of(values)
                if key not in self.overlay:
                    found.add(key)
                    self._base_rows[key] = (index, values)
        return sorted(found, key=repr)

    def _base_index(self, fk: ForeignKey) -> _Index:
        index = self._base_by_fk.get(fk.name)
        if index is None:
            index = self._base_by_fk[fk.name] = _Index(
                [self.base.arrays[c] for c in fk.columns],
                [self._norm.get(c, _same) for c in fk.columns],
            )
        return index

    def row(self, key: Key) -> Values:
        """The full row of ``key`` now (a member `members` found; the table `rewrites`)."""
        entry = self.overlay.get(key)
        if entry is not None:
            assert entry.values is not None, f"{self.info.name}: row {key} is deleted"
            return dict(entry.values) if entry.ref is None else _row(*entry.ref)
        return self.base.row(self._base_rows[key][0])

    def values(self, key: Key) -> Values:
        """The needed columns of ``key``'s row now (it exists)."""
        entry = self.overlay.get(key)
        if entry is not None:
            assert entry.values is not None, f"{self.info.name}: row {key} is deleted"
            return {c: entry.values.get(c) for c in self.needed}
        return dict(self._base_rows[key][1])


def _order_indexes(segment: pa.Table) -> list[int]:
    """The row indexes of ``segment`` in position order."""
    files = segment.column("_tm_file").to_pylist()
    positions = segment.column("_tm_pos").to_pylist()
    rows = segment.column("_tm_row").to_pylist()
    return sorted(range(segment.num_rows), key=lambda i: (files[i], positions[i], rows[i]))


def _same(value: Any) -> Any:
    return value


def _rstrip(value: Any) -> Any:
    return value.rstrip(" ") if isinstance(value, str) else value
