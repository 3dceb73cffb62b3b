"""The child-side changes of foreign-key cascades, derived from the parents' row events.

InnoDB runs ``ON DELETE``/``ON UPDATE`` ``CASCADE`` and ``SET NULL`` inside the engine and the
binlog holds no row of the child rows it changes (docs/design.md, "Foreign-key cascades"). A
parent's delete, or an update of its referenced columns, at position ``p`` is turned here into
the changes the engine made at ``p``: each child row whose foreign key held the parent's old
values is deleted, set null or given the new values, and so on down (grandchildren, a tree
table's subtrees), as ordinary change records at ``p`` - a delete, or an update with the full
image - so that reconcile keeps its one rule. Which child rows, and their images, come from the
child's `TableState` at ``p``. A rows event written with ``foreign_key_checks=0`` cascaded
nothing and derives nothing.

Where the state cannot be exact, the tables concerned are re-read from ``p`` instead (the
capture's `change`, logged with the reason): a key `orchestrator.schema.cascades` marks so
(text in a collation, SET DEFAULT...); a cascade into a table whose rows are not all known at
``p`` - a parent outside the run, a table with a ``where`` filter, a snapshot whose reads may
have seen ``p`` already, a table whose base lies after ``p`` - for the run tables below it that
the rows it may hide could reach; and a parent key value a cascade removed that an ``ON UPDATE``
brings back while a child's reads were running. Why each is exact, or re-read: docs/design.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from orchestrator.binlog.events import NO_FOREIGN_KEY_CHECKS
from orchestrator.pipeline.capture.buffer import NEVER, CaptureTable, Drained
from orchestrator.pipeline.capture.cascade_state import (
    Base,
    BaseSpec,
    Key,
    TableState,
    Values,
    read_file,
)
from orchestrator.pipeline.changes import META_COLUMNS, OLD_PREFIX, OP, RESERVED_PREFIX
from orchestrator.schema.cascades import ForeignKey

log = logging.getLogger(__name__)

At = tuple[int, int, int]  # (file index, end position, row number)
#: How a cascade changes a table's rows: deletes them, or changes these columns.
Change = Literal["delete"] | frozenset[str]
#: Deeper than this, the engine refuses the statement (InnoDB stops at 15 levels).
MAX_DEPTH = 64


@dataclass(frozen=True, slots=True)
class Reread:
    """Tables to re-read from a position, and why (the capture's `TableChange`)."""

    tables: frozenset[str]
    what: str
    file: int
    pos: int


@dataclass
class _Pending:
    """The derived changes of one parent row, one per child row: by table and the row's key now,
    its key before the parent row's cascades and its image now (None: deleted)."""

    rows: dict[tuple[str, Key], tuple[Key, Values | None]] = field(default_factory=dict)


class Cascades:
    """Derives the cascades of one capture pass.

    Args:
        keys: the run's cascading foreign keys (each table's ``cascades`` run info).
        tables: every table whose rows events are captured, run tables and parents outside the
            run (`CaptureTable.published` False), by name.
        starts: the capture's start position of each table (shared: a re-read or failed table's
            becomes the capture's "never").
        bases: where a run table's base rows are (None: it has none the derivation can use).
        segments: a run table's durable change segments (read back into its state).
        reread: called with the tables to re-read from a position.
    """

    def __init__(
        self,
        keys: Sequence[ForeignKey],
        tables: Mapping[str, CaptureTable],
        starts: MutableMapping[str, At],
        bases: Callable[[str], BaseSpec | None],
        segments: Callable[[str], Sequence[str]],
        reread: Callable[[Reread], None],
    ) -> None:
        self.keys = list(keys)
        self.tables = tables
        self.starts = starts
        self._bases = bases
        self._segments = segments
        self._reread = reread
        self.as_parent: dict[str, list[ForeignKey]] = {}  # table -> the keys it is the parent of
        self.as_child: dict[str, list[ForeignKey]] = {}  # table -> the keys it is the child of
        for key in self.keys:
            self.as_parent.setdefault(key.parent, []).append(key)
            self.as_child.setdefault(key.child, []).append(key)
        self.states: dict[str, TableState | None] = {}
        # A child's state is built when a cascade first reaches it: until then its own changes are
        # only remembered where they are (segments written by this pass, rows of this flush).
        self._written: dict[str, list[str]] = {}
        self._deferred: dict[str, list[tuple[Drained, dict[str, list[Any]], int]]] = {}
        self._removed: dict[tuple[str, str], set[Key]] = {}  # (key, child) -> values removed
        self._pending = _Pending()
        self._at: At = (0, 0, 0)
        self.derived: dict[str, list[tuple[At, str, Values | None, Key, Key]]] = {}

    @property
    def watched(self) -> set[str]:
        """The tables whose rows the derivation reads: parents and children."""
        return set(self.as_parent) | set(self.as_child)

    def start(self, table: str) -> At | None:
        """Where ``table``'s own changes begin: its base has every change up to here (None: not
        captured; `NEVER`: no longer, it is re-read or failed)."""
        captured, start = self.tables.get(table), self.starts.get(table)
        if captured is None or start is None:
            return None
        return NEVER if start == NEVER else captured.start.key

    # ------------------------------------------------------------------ state

    def needed(self, table: str) -> list[str]:
        """The columns of ``table`` the derivation reads: key, foreign-key and referenced."""
        captured = self.tables[table]
        names = [*captured.key]
        for key in self.as_child.get(table, []):
            names += key.columns
        for key in self.as_parent.get(table, []):
            names += key.referenced
        canonical = [captured.info.column(n).name for n in names]
        return list(dict.fromkeys(canonical))

    def state(self, table: str) -> TableState | None:
        """``table``'s rows (None: not known, a table outside the run or without a base)."""
        if table not in self.states:
            captured = self.tables.get(table)
            spec = self._bases(table) if captured is not None and captured.published else None
            if captured is None or spec is None:
                self.states[table] = None
            else:
                needed = self.needed(table)
                state = TableState(
                    captured.info,
                    tuple(captured.info.column(k).name for k in captured.key),
                    self.as_child.get(table, []),
                    needed,
                    Base(spec.files, needed),
                    spec.complete,
                )
                for uri in [*self._segments(table), *self._written.get(table, [])]:
                    state.load(read_file(uri), uri)
                for part, columns, i in self._deferred.pop(table, []):
                    self._own(state, part, columns, i)
                self.states[table] = state
        return self.states[table]

    def written(self, table: str, uri: str) -> None:
        """The capture wrote a segment of ``table`` (read back if its state is built later)."""
        if table in self.as_child and table not in self.states:
            self._written.setdefault(table, []).append(uri)

    # ------------------------------------------------------------------ a flush

    def process(self, drained: Mapping[str, Drained]) -> dict[str, pa.Table]:
        """Apply the flushed rows of the watched tables in position order: own changes update
        their table's state, a parent's row derives its cascades. Returns the derived changes by
        table, in the table's segment schema."""
        order: list[tuple[int, int, int, str, int]] = []
        for name, part in drained.items():
            if name in self.watched and part.table.num_rows:
                files, positions, rows = (
                    part.table.column(c).to_pylist() for c in ("_tm_file", "_tm_pos", "_tm_row")
                )
                order += [
                    (f, p, r, name, i)
                    for i, (f, p, r) in enumerate(zip(files, positions, rows, strict=True))
                ]
        order.sort()
        columns: dict[str, dict[str, list[Any]]] = {}
        for f, p, r, name, i in order:
            part = drained[name]
            if name not in columns:
                columns[name] = _columns(part, self.tables[name], self.needed(name))
            self._row(name, part, columns[name], i, (f, p, r))
        self._deferred = {}  # the capture writes them: `written` says where
        return self._derived_tables()

    def _row(self, name: str, part: Drained, columns: dict[str, list[Any]], i: int, at: At) -> None:
        op = columns[OP][i]
        captured = self.tables[name]
        after = {c: v[i] for c, v in columns.items() if not c.startswith(RESERVED_PREFIX)}
        start = self.start(name)
        if name in self.as_child and start is not None and at > start:
            if name in self.states:
                state = self.states[name]
                if state is not None:
                    self._own(state, part, columns, i)
            else:
                self._deferred.setdefault(name, []).append((part, columns, i))
        if name not in self.as_parent or op == "I" or part.flags[i] & NO_FOREIGN_KEY_CHECKS:
            return  # an insert cascades nothing; foreign_key_checks=0: the engine ran no action
        before = dict(after)
        if op == "U":
            for c in captured.key:
                before[captured.info.column(c).name] = columns[OLD_PREFIX + c][i]
            for c in part.before:
                before[c] = columns[_BEFORE + c][i]
        self._cascade(name, "D" if op == "D" else "U", before, after, at, 0)
        self._flush_pending()

    @staticmethod
    def _own(state: TableState, part: Drained, columns: dict[str, list[Any]], i: int) -> None:
        """One of the table's own flushed changes, applied to its state."""
        values = {c: v[i] for c, v in columns.items() if not c.startswith(RESERVED_PREFIX)}
        old = tuple(columns[OLD_PREFIX + k][i] for k in state.key)
        state.own(columns[OP][i], values, old, (part.table, i))

    # ------------------------------------------------------------------ cascades

    def _cascade(
        self,
        parent: str,
        op: Literal["D", "U"],
        before: Values,
        after: Values | None,
        at: At,
        depth: int,
    ) -> None:
        """The cascades of a ``parent`` row changing from ``before`` to ``after`` (None: gone)."""
        if depth > MAX_DEPTH:
            raise RuntimeError(f"cascades deeper than {MAX_DEPTH} levels from {parent} at {at}")
        for key in self.as_parent.get(parent, []):
            old = tuple(before.get(c) for c in key.referenced)
            if any(v is None for v in old):
                continue
            new: Key = ()
            if op == "U":
                assert after is not None
                new = tuple(after.get(c) for c in key.referenced)
                if new == old:
                    continue
            rule = key.action(op)
            if rule is not None:
                self._into(key, rule, op, old, new, at, depth)

    def _into(
        self,
        key: ForeignKey,
        rule: str,
        op: Literal["D", "U"],
        old: Key,
        new: Key,
        at: At,
        depth: int,
    ) -> None:
        """The changes ``key``'s rule makes in its child for a parent's old values ``old``."""
        child = key.child
        change: Change = "delete" if op == "D" and rule == "CASCADE" else frozenset(key.columns)
        start = self.start(child)
        where = f"{'a delete' if op == 'D' else 'an update'} of {key.parent} through {key.name}"
        if start is None or start == NEVER or at <= start:
            # Not captured, or no longer, or its base already has this change: whatever it did
            # there, the run tables below that start earlier cannot be derived from it.
            self._risk(
                child, change, at, f"{where} into {child}, whose rows at that point are not known"
            )
            return
        if key.rereads is not None:
            self._fallback({child} | self.below(child, at), at, f"{where}: {key.rereads}")
            return
        state = self.state(child)
        if state is None:
            self._risk(child, change, at, f"{where} into {child}, whose rows are not all known")
            return
        if state.complete is None or at < state.complete:
            self._risk(child, change, at, f"{where} while {child}'s rows were being read")
            self._reuse(key, op, old, new, at)
        if self.start(child) != start:  # re-read from here
            return
        for member in state.members(key, state.normalized(key, old)):
            current = state.row(member) if change != "delete" else state.values(member)
            image: Values | None
            if change == "delete":
                image = None
            elif rule == "SET NULL":
                image = {**current, **dict.fromkeys(key.columns, None)}
            else:  # CASCADE of an update: the parent's new values
                image = {**current, **dict(zip(key.columns, new, strict=True))}
            target = member if image is None else state.key_of(image)
            if image is not None and target != member:
                state.set(member, None)
            state.set(target, image)
            self._emit(child, at, member, target, image)
            self._cascade(child, "D" if image is None else "U", current, image, at, depth + 1)

    def _reuse(self, key: ForeignKey, op: str, old: Key, new: Key, at: At) -> None:
        """A parent value a cascade removed while the child was read, brought back by an ``ON
        UPDATE``: a child row read after both could be taken for one that held it: re-read."""
        removed = self._removed.setdefault((key.name, key.child), set())
        if op == "U" and new in removed:
            self._fallback(
                {key.child} | self.below(key.child, at),
                at,
                f"an update of {key.parent} gives back a key value a cascade removed while "
                f"{key.child} was being read",
            )
        removed.add(old)

    def _emit(self, table: str, at: At, member: Key, target: Key, image: Values | None) -> None:
        """Record a derived change: one per child row and parent row (its last state then)."""
        pending = self._pending.rows
        original = pending.pop((table, member))[0] if (table, member) in pending else member
        pending[(table, target)] = (original, image)
        self._at = at

    def _flush_pending(self) -> None:
        """The parent row's derived changes, to the records of the tables still captured."""
        for (table, target), (original, image) in self._pending.rows.items():
            start = self.start(table)
            if start is not None and self._at > start:
                self.derived.setdefault(table, []).append(
                    (self._at, "D" if image is None else "U", image, target, original)
                )
        self._pending = _Pending()

    # ------------------------------------------------------------------ re-reads

    def _risk(self, table: str, change: Change, at: At, why: str) -> None:
        """Rows of ``table`` changed at ``at`` that the derivation cannot see: re-read the run
        tables below it that such a change can reach."""
        reached = self._reached(table, change, at, set())
        if reached:
            self._fallback(reached, at, f"{why} can reach them")

    def _reached(
        self, table: str, change: Change, at: At, seen: set[Any], every: bool = False
    ) -> set[str]:
        out: set[str] = set()
        for key in self.as_parent.get(table, []):
            if change == "delete":
                rule = key.action("D")
            elif set(key.referenced) & change:
                rule = key.action("U")
            else:
                continue
            if rule is None:
                continue
            child = key.child
            following: Change = (
                "delete" if change == "delete" and rule == "CASCADE" else frozenset(key.columns)
            )
            start = self.start(child)
            published = self.tables.get(child) is not None and self.tables[child].published
            if published and start is not None and start != NEVER and (every or start < at):
                out.add(child)
            if (child, following) not in seen:
                seen.add((child, following))
                out |= self._reached(child, following, at, seen, every)
        return out

    def below(self, table: str, at: At, every: bool = False) -> set[str]:
        """Every run table a change of ``table``'s rows at ``at`` may reach, of those whose own
        start is before ``at`` (``every``: of all still captured, whatever their start)."""
        return self._reached(table, "delete", at, set(), every) | self._reached(
            table, frozenset(c.name for c in self.tables[table].info.columns), at, set(), every
        )

    def _fallback(self, tables: set[str], at: At, why: str) -> None:
        live = frozenset(
            t
            for t in tables
            if (start := self.start(t)) is not None and start != NEVER and at > start
        )
        if live:
            self._reread(Reread(live, f"a foreign-key cascade ({why})", at[0], at[1]))

    # ------------------------------------------------------------------ records

    def _derived_tables(self) -> dict[str, pa.Table]:
        out = {}
        for table, records in self.derived.items():
            if records:
                out[table] = derived_table(self.tables[table], records)
        self.derived = {}
        return out


#: The prefix of a before-image column among `_columns`'.
_BEFORE = "_tm_before_"


def _columns(part: Drained, captured: CaptureTable, needed: Sequence[str]) -> dict[str, list[Any]]:
    """The columns of a flushed table the derivation reads, as Python lists: the operation, the
    needed columns (after image), the old key and the before image of `CaptureTable.before`."""
    table = part.table
    names = [OP, *needed, *(OLD_PREFIX + k for k in captured.key)]
    return {n: table.column(n).to_pylist() for n in dict.fromkeys(names)} | {
        _BEFORE + c: v.to_pylist() for c, v in part.before.items()
    }


def derived_table(
    captured: CaptureTable, records: Sequence[tuple[At, str, Values | None, Key, Key]]
) -> pa.Table:
    """Derived changes as a segment of ``captured``'s schema: a delete's columns other than its
    key are never read (reconcile deletes by key), so they hold placeholders."""
    from orchestrator.schema.values import staging_schema

    schema = staging_schema(captured.info.columns)
    key = [captured.info.column(k).name for k in captured.key]
    data: dict[str, list[Any]] = {name: [] for name in (*META_COLUMNS, *schema.names)}
    olds: dict[str, list[Any]] = {k: [] for k in key}
    fillers = {f.name: _placeholder(f.type) for f in schema if not f.nullable}
    for at, op, image, target, original in records:
        for name, value in zip(META_COLUMNS, (*at, op), strict=True):
            data[name].append(value)
        # A delete: its key, and placeholders in the required columns.
        values = fillers | dict(zip(key, target, strict=True)) if image is None else image
        for name in schema.names:
            data[name].append(values.get(name))
        for k, v in zip(key, original, strict=True):
            olds[k].append(v)
    arrays = [pa.array(data[n], pa.int64()) for n in META_COLUMNS[:3]]
    arrays.append(pa.array(data[OP], pa.string()))
    arrays += [pa.array(data[f.name], f.type) for f in schema]
    arrays += [pa.array(olds[k], schema.field(k).type) for k in key]
    names = [*META_COLUMNS, *schema.names, *(OLD_PREFIX + k for k in key)]
    return pa.Table.from_arrays(arrays, names=names)


def _placeholder(kind: pa.DataType) -> Any:
    """A value of ``kind`` for a required column of a derived delete (never read)."""
    if pa.types.is_string(kind):
        return ""
    if pa.types.is_binary(kind):
        return b""
    if pa.types.is_boolean(kind):
        return False
    if pa.types.is_decimal(kind):
        from decimal import Decimal

        return Decimal(0)
    if pa.types.is_date(kind):
        import datetime as dt

        return dt.date(1970, 1, 1)
    if pa.types.is_timestamp(kind):
        import datetime as dt

        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC if kind.tz else None)
    return 0
