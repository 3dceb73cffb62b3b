"""How a version's data files cover the key space, so an incremental run rewrites only what changed.

The layout (docs/output.md):

- every data file holds the rows of one key range, sorted by key, and the files of
  a version, in manifest order, hold disjoint ranges in ascending key order;
- the manifest's ``file_ranges`` says, per file and in the order of ``files``, its
  first and last key (`chunking.encode_key` of the published values), rows and bytes;
- a version shares every file whose keys did not change with the previous one;
  files are never modified (copy-on-write per file).

*Which order.* Files are sorted by Spark (each snapshot chunk's file, and a table
reconciled whole) or merged in that order by pyarrow, so their order is Spark's order of
the published values: numbers, decimals and temporal values by value, binary strings
bytewise, text by its UTF-8 bytes (code points, *not* the column's collation), NULL first.
pyarrow sorts these types the same way with nulls first, and Python orders their values the
same way with NULL made the smallest (`orchestrator.lake.order`), so membership of a changed
key is decided in the files' order by either engine, for any collation. Key equality is
value equality, NULL equal to NULL, as in the reconcile (the binlog carries a key exactly
as stored).

*The first version* of a table is the snapshot's chunk files: chunks are disjoint key ranges
and each chunk's file is sorted, so when their ranges, ordered by first key, are also
disjoint in the files' order (always, unless a text key's collation orders otherwise than
its bytes) they are a version's layout as they stand, and only the files whose slot holds a
change of the run are rewritten.

*Territories.* The ``n`` non-empty files of the base version cut the key space
into slots: slot ``-1`` below the first file's first key (new head file),
slot ``i`` from file ``i``'s first key up to file ``i + 1``'s first key (the
gap after a file belongs to it), the last file up to and including its last key,
and slot ``n`` above it (new tail file). A changed key (or the old key of a
key-changing update) belongs to exactly one slot; only slots with changes are
rewritten.

*Sizes* are published bytes. A snapshot writes one file per chunk (``chunk_size`` rows); a
whole table that Spark reconciles is cut into files of about `TARGET_FILE_BYTES`. A rewritten
file is cut into equal pieces once it would exceed twice the target (its size estimated from
the table's bytes per row); a new small file (under `SMALL_FILE_BYTES`) is merged with an
adjacent small file (`group_parts`), so runs of tail inserts do not fragment the table.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from chunking import decode_key
from orchestrator.errors import RunFailed
from orchestrator.lake import storage
from orchestrator.schema.tables import ColumnInfo
from orchestrator.schema.values import time_micros

#: A whole table written at once (Spark's reconcile) is cut into files of about this many bytes
#: of Parquet; a rewritten file is split once it would exceed twice this.
TARGET_FILE_BYTES = 32 * 1024 * 1024
#: A file below this size is small: a new small file is merged with a small neighbour. Well below
#: a chunk's file (a snapshot writes one per chunk: 200,000 rows of shop.orders are 2.7 MiB), so
#: a rewrite never pulls unchanged chunk files in; what it merges is the small files runs of
#: tail inserts leave behind.
SMALL_FILE_BYTES = 1024 * 1024
DATA_DIR = "data"
#: A table dir's directory of manifests (`orchestrator.lake.manifest`).
META_DIR = "_tidemark"
#: Rows per record batch when converting or copying data files.
BATCH_ROWS = 65536
#: The hand-over from reconcile to publish, in the reconciled staging dir
#: (a name starting with ``_`` that `storage.list_files` leaves out).
PLAN_FILE = "_tidemark_version.json"
#: Many tables' plans in one file (`write_plans`): tables without a change, a batch at a time.
PLANS_FILE = "_tidemark_versions.json"
PLAN_FORMAT = 2
HEAD_SLOT = -1


class FileRange(TypedDict):
    """One entry of the manifest's ``file_ranges``."""

    file: str
    min_key: list[Any] | None  # encode_key of the first key; None for an empty file
    max_key: list[Any] | None
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Territory:
    """The keys one slot owns: from ``low`` to ``high``; ``None`` is unbounded."""

    slot: int
    low: list[Any] | None
    low_inclusive: bool
    high: list[Any] | None
    high_inclusive: bool


class PlannedFile(TypedDict):
    """One file of the version a reconcile planned, in key order: a `FileRange` whose ``file`` is
    either a file of the base version (``shared``, relative to the table dir) or a finished data
    file in staging (a URI) that publish moves into the table's ``data/``."""

    file: str
    min_key: list[Any] | None
    max_key: list[Any] | None
    rows: int
    bytes: int
    shared: bool


def planned(entry: FileRange, file: str, shared: bool) -> PlannedFile:
    """``entry`` as a planned file named ``file``."""
    return PlannedFile(
        file=file,
        min_key=entry["min_key"],
        max_key=entry["max_key"],
        rows=entry["rows"],
        bytes=entry["bytes"],
        shared=shared,
    )


def as_range(entry: PlannedFile, file: str, nbytes: int) -> FileRange:
    """A planned file as the manifest's `FileRange`, named ``file`` with ``nbytes`` bytes."""
    return FileRange(
        file=file,
        min_key=entry["min_key"],
        max_key=entry["max_key"],
        rows=entry["rows"],
        bytes=nbytes,
    )


@dataclass(frozen=True, slots=True)
class VersionPlan:
    """The hand-over from reconcile to publish: the new version's files, in key order.

    ``base_version`` is the version an incremental run rewrote (None: a snapshot, whose files
    are all new); ``slots`` the slots whose files were rewritten (for the log and tests).
    """

    base_version: int | None
    slots: tuple[int, ...]
    files: tuple[PlannedFile, ...]

    @property
    def rows(self) -> int:
        return sum(f["rows"] for f in self.files)

    def __str__(self) -> str:
        new = [f for f in self.files if not f["shared"]]
        return (
            f"{len(self.files)} file(s) ({len(new)} new holding "
            f"{sum(f['rows'] for f in new)} rows, "
            f"{len(self.files) - len(new)} shared), {self.rows} rows"
        )


@dataclass(frozen=True, slots=True)
class Part:
    """A run of rows, in key order, that a new version consists of.

    ``kept`` is set when the part is a finished file that can stay as it is (a base version's
    file, or a snapshot's chunk file); ``slot`` when it is a rewritten slot: the rows of ``uri``
    (the slot's base file; empty: none) with the slot's changes merged in. Otherwise ``uri`` is a
    staging file of new rows. ``rows`` and ``bytes`` (published bytes) may be estimates.
    """

    uri: str
    rows: int
    bytes: int
    kept: FileRange | None = None
    slot: int | None = None

    @property
    def new(self) -> bool:
        return self.kept is None


def current_uri(tdir: str) -> str:
    """The table dir's current manifest (`orchestrator.lake.manifest`)."""
    return storage.join(tdir, META_DIR, "current.json")


# --------------------------------------------------------------------------- manifest ranges


def usable_ranges(
    files: Sequence[str], ranges: Sequence[FileRange] | None
) -> list[FileRange] | None:
    """The base version's non-empty file ranges, or None when the manifest has none to trust.

    A manifest from before ``file_ranges`` existed (or one whose ranges do not
    match its files) makes the incremental run rewrite the whole table once.

    >>> r = lambda f, n: {"file": f, "min_key": [1] if n else None, "max_key": [2] if n else None,
    ...                   "rows": n, "bytes": 9}
    >>> [x["file"] for x in usable_ranges(["a", "b"], [r("a", 0), r("b", 5)])]
    ['b']
    >>> usable_ranges(["a"], None) is None, usable_ranges(["a", "b"], [r("b", 1)]) is None
    (True, True)
    """
    if ranges is None or [r["file"] for r in ranges] != list(files):
        return None
    return [r for r in ranges if r["rows"] > 0]


def territories(ranges: Sequence[FileRange]) -> list[Territory]:
    """The slots the base files cut the key space into (module docstring, "Territories").

    >>> [(t.slot, t.low, t.high) for t in territories([
    ...     {"file": "a", "min_key": [1], "max_key": [5], "rows": 5, "bytes": 1},
    ...     {"file": "b", "min_key": [9], "max_key": [12], "rows": 4, "bytes": 1}])]
    [(-1, None, [1]), (0, [1], [9]), (1, [9], [12]), (2, [12], None)]
    >>> [(t.slot, t.low, t.high) for t in territories([])]
    [(0, None, None)]
    """
    if not ranges:
        return [Territory(0, None, True, None, True)]
    out = [Territory(HEAD_SLOT, None, True, ranges[0]["min_key"], False)]
    for i, entry in enumerate(ranges):
        last = i == len(ranges) - 1
        high = entry["max_key"] if last else ranges[i + 1]["min_key"]
        out.append(Territory(i, entry["min_key"], True, high, last))
    out.append(Territory(len(ranges), ranges[-1]["max_key"], False, None, True))
    return out


def staging_key(columns: Sequence[ColumnInfo], encoded: list[Any]) -> tuple[Any, ...]:
    """A manifest key (published values, JSON-encoded) as staging values for Spark.

    >>> from orchestrator.schema.tables import ColumnInfo as C
    >>> staging_key([C("t", "time", "time", False), C("n", "int", "int", False)],
    ...             [{"timedelta": "-01:00:00.000000"}, 7])
    (-3600000000, 7)
    """
    values = decode_key(encoded)
    assert values is not None
    out = []
    for column, value in zip(columns, values, strict=True):
        if column.data_type == "time" and isinstance(value, timedelta):
            value = time_micros(value)
        out.append(value)
    return tuple(out)


# --------------------------------------------------------------------------- sizes


def piece_rows(rows: int, nbytes: int, target: int) -> int:
    """Rows per output file: all of them, unless the data exceeds twice the target.

    >>> piece_rows(1000, 50, 100), piece_rows(1000, 250, 100), piece_rows(0, 0, 100)
    (1000, 334, 0)
    """
    if nbytes <= 2 * target or rows == 0:
        return rows
    return math.ceil(rows / math.ceil(nbytes / target))


def version_parts(
    base: Sequence[tuple[str, FileRange]], rewritten: Mapping[int, tuple[int, int]]
) -> list[Part]:
    """The parts of a new version in key order: each base file (``(uri, range)``, in key order)
    kept as it is, unless its slot is rewritten: then the slot's part, which reads the file's
    rows (``uri``) with the slot's changes merged in; ``rewritten`` gives each rewritten slot's
    rows and bytes (or estimates; 0 rows: the slot lost every row, no part). The head and tail
    slots have no base file.

    >>> r = {"file": "f", "min_key": [1], "max_key": [2], "rows": 5, "bytes": 50}
    >>> [(p.uri, p.slot, p.new)
    ...  for p in version_parts([("a", r), ("b", r)], {-1: (1, 9), 1: (6, 60)})]
    [('', -1, True), ('a', None, False), ('b', 1, True)]
    >>> [p.uri for p in version_parts([("a", r), ("b", r)], {0: (0, 0)})]
    ['b']
    """
    parts = []
    for slot in range(HEAD_SLOT, len(base) + 1):
        uri = base[slot][0] if 0 <= slot < len(base) else ""
        if slot in rewritten:
            rows, nbytes = rewritten[slot]
            if rows:  # a slot that lost every row leaves no part
                parts.append(Part(uri, rows, nbytes, slot=slot))
        elif uri:
            entry = base[slot][1]
            parts.append(Part(uri, entry["rows"], entry["bytes"], kept=entry))
    return parts


def group_parts(parts: Sequence[Part], small: int) -> list[list[int]]:
    """Indexes of adjacent parts to write as one file; every other part is one group.

    A new part smaller than ``small`` joins its small neighbours (a shared small
    file is rewritten into the merged one) while the group stays under ``small``;
    two shared files are never merged with each other, so a version without new
    small files rewrites nothing.

    >>> P = lambda b, new: Part("x", 1, b, None if new else {
    ...     "file": "f", "min_key": None, "max_key": None, "rows": 1, "bytes": b})
    >>> group_parts([P(5, False), P(5, False), P(5, True), P(50, False)], small=20)
    [[0], [1, 2], [3]]
    >>> group_parts([P(5, True), P(5, True), P(15, True), P(5, False)], small=20)
    [[0, 1, 2], [3]]
    """
    groups: list[list[int]] = []
    for i, part in enumerate(parts):
        if groups:
            group = groups[-1]
            total = sum(parts[j].bytes for j in group)
            if (
                part.bytes < small
                and total < small
                and (part.new or any(parts[j].new for j in group))
            ):
                group.append(i)
                continue
        groups.append([i])
    return groups


# --------------------------------------------------------------- the reconcile -> publish hand-over


def write_plan(out_dir: str, plan: VersionPlan) -> None:
    storage.write_atomic(
        storage.join(out_dir, PLAN_FILE), (json.dumps(_plan_json(plan)) + "\n").encode()
    )


def write_plans(directory: str, plans: Mapping[str, VersionPlan]) -> None:
    """Many tables' plans in one file (`PLANS_FILE`): the plan of ``name`` is read back by
    `read_plan` of ``storage.join(directory, name)``, a directory never created. One write (and
    fsync) for many tables without a change, instead of a directory and a file each."""
    body = {
        "format": PLAN_FORMAT,
        "plans": {name: _plan_json(plan) for name, plan in plans.items()},
    }
    storage.write_atomic(storage.join(directory, PLANS_FILE), (json.dumps(body) + "\n").encode())


def read_plan(out_dir: str, *, shared_only: bool = False) -> VersionPlan | None:
    """The version plan a reconcile wrote to ``out_dir`` (or, for a table of a `write_plans` file,
    to that file beside it), or None when there is none (a directory of staging files that make a
    whole table, in order). ``shared_only``: the caller knows ``out_dir`` names a table of a
    `write_plans` file (a directory never made): its own plan is not looked for."""
    uri = storage.join(out_dir, PLAN_FILE)
    own = None if shared_only else storage.read_if_exists(uri)
    if own is not None:
        return _plan_from_json(json.loads(own), uri)
    shared = storage.join(storage.parent(out_dir), PLANS_FILE)
    try:
        data = _plans_file(shared)
    except FileNotFoundError:
        return None
    name = storage.basename(out_dir)
    if name not in data:
        raise RunFailed(
            f"{shared} holds no plan of {name}: the state store names a reconcile that "
            "did not write it; rerun `tidemark run` (reconcile is redone)"
        )
    return _plan_from_json(data[name], shared)


@functools.lru_cache(maxsize=8)
def _plans_file(uri: str) -> dict[str, Any]:
    """A `write_plans` file's plans by name, read once per process: its name is unique to the
    reconcile attempt that wrote it whole (`storage.write_atomic`), so it never changes.

    Raises:
        FileNotFoundError: there is no such file (not kept: it may be written later).
    """
    data = json.loads(storage.read_bytes(uri))
    if data.get("format") != PLAN_FORMAT:
        raise RunFailed(_OLDER.format(uri=uri))
    plans: dict[str, Any] = data["plans"]
    return plans


_OLDER = (
    "{uri} was written by an older release of Tidemark, which publish cannot read; re-snapshot "
    "the table: tidemark run --table <table> --snapshot"
)


def _plan_json(plan: VersionPlan) -> dict[str, Any]:
    return {
        "format": PLAN_FORMAT,
        "base_version": plan.base_version,
        "slots": list(plan.slots),
        "files": list(plan.files),
    }


def _plan_from_json(data: dict[str, Any], uri: str) -> VersionPlan:
    if data.get("format") != PLAN_FORMAT:
        raise RunFailed(_OLDER.format(uri=uri))
    base = data["base_version"]
    return VersionPlan(
        None if base is None else int(base),
        tuple(int(s) for s in data["slots"]),
        tuple(_planned_from_json(f) for f in data["files"]),
    )


def _planned_from_json(data: dict[str, Any]) -> PlannedFile:
    return PlannedFile(
        file=str(data["file"]),
        min_key=data["min_key"],
        max_key=data["max_key"],
        rows=int(data["rows"]),
        bytes=int(data["bytes"]),
        shared=bool(data["shared"]),
    )


def slot_column(columns: Sequence[str]) -> str:
    """A name for the slot column that no table column has (it names directories, so no ``_``).

    >>> slot_column(["id", "tm_slot"])
    'tm_slot1'
    """
    taken = {c.lower() for c in columns}
    name, n = "tm_slot", 0
    while (name if n == 0 else f"{name}{n}") in taken:
        n += 1
    return name if n == 0 else f"{name}{n}"
