"""Reconcile of a table without a key: its changes applied to the multiset of its rows.

Such a table is the multiset of its rows (docs/design.md, "Tables without a key"). With full row
images every change says which row it adds or removes: an insert adds its row, a delete removes
one row identical to its image, an update removes one row identical to its before image and adds
its after image. Counting is exact whatever the order, so the table at ``H`` is the base (the
snapshot read at ``S``, or the published version at its position) plus every change after that
position, each applied once: the changes at or before it are dropped (`signed_rows`: a capture
that resumed from an earlier position, as a prepared XA transaction makes it, sees some again),
and a change seen twice - the same binlog position - counts once.

The base files are sorted by row hash and each holds one hash range (`orchestrator.lake.hashfiles`),
so a changed row belongs to one slot (`orchestrator.lake.layout`, "Territories", on the hash), and
rows identical to it are in that slot's file. Only the slots with a net change are rewritten
(`_Slots.rows`): the base file's rows less one identical row per removal (identity by
`orchestrator.lake.rowhash.row_identity`, never by hash alone), plus the added rows, sorted by
hash. A removal that finds no identical row means the lake is not the table it should be: the
table fails, naming the row, and is read again. Every other file is kept as it is. The driver does
it all (pyarrow and numpy); the files of a rewritten slot are written in parallel.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.errors import RunFailed, resnapshot_hint
from orchestrator.lake import layout, storage
from orchestrator.lake.hashfiles import write_sorted
from orchestrator.lake.layout import FileRange, Part, PlannedFile, VersionPlan
from orchestrator.lake.manifest import read_manifest
from orchestrator.lake.rowhash import row_hashes, row_identity
from orchestrator.lake.writer import read_published, to_published
from orchestrator.pipeline.changes import OLD_PREFIX, OP, POSITION
from orchestrator.pipeline.reconcile import local
from orchestrator.pipeline.reconcile.kept import planned_base
from orchestrator.pipeline.reconcile.rewrite import published_ids_first
from orchestrator.pipeline.segments import Changes, segment_files
from orchestrator.positions import BinlogPosition, file_index

if TYPE_CHECKING:
    from orchestrator.pipeline.reconcile.kept import KeptPlans
    from orchestrator.pipeline.reconcile.rewrite import Target

log = logging.getLogger("orchestrator.pipeline.reconcile.rewrite")

#: A base file: where to read it, and its range (``file``: the name the plan keeps it under).
BaseFile = tuple[str, FileRange]


@dataclass(frozen=True, slots=True)
class Net:
    """The net change of the run to rows identical to one row: ``count`` more (fewer when
    negative) than the base holds; ``index`` is that row in the signed rows, ``hash`` its hash."""

    hash: int
    index: int
    count: int


def snapshot_base(chunk_ranges: Sequence[FileRange]) -> list[BaseFile]:
    """A snapshot's base files (the read's, as it recorded them), in hash order."""
    files = [(r["file"], r) for r in chunk_ranges if r["rows"]]
    return sorted(files, key=lambda f: _first(f[1]))


def reconcile_snapshot(
    target: Target,
    chunk_ranges: Sequence[FileRange],
    changes: Changes,
    start: BinlogPosition,
    plans: KeptPlans | None = None,
) -> int:
    """A snapshot read at ``start``: its files, with the changes after ``start``. Returns the
    rows at ``H``. ``plans``: the batch that takes the plan when no file is written."""
    return rewrite(target, snapshot_base(chunk_ranges), changes, start, None, plans)


def reconcile_incremental(
    target: Target, tdir: str, changes: Changes, planned: int | None = None
) -> int:
    """The published version (the one the run planned on, ``planned``) with the changes after its
    position. Returns the rows at ``H``."""
    manifest = read_manifest(tdir)
    planned_base(target.table.name, manifest, planned)
    target = published_ids_first(target, tdir, manifest)
    ranges = layout.usable_ranges(manifest["files"], manifest.get("file_ranges"))
    if ranges is None:
        raise RunFailed(
            f"table {target.table.name}: version {manifest['version']} has no file ranges; "
            + resnapshot_hint(target.table.name)
        )
    base = [(storage.join(tdir, r["file"]), r) for r in ranges]
    floor = BinlogPosition.from_json(dict(manifest["position"]))
    return rewrite(target, base, changes, floor, manifest["version"], None)


def rewrite(
    target: Target,
    base: Sequence[BaseFile],
    changes: Changes,
    floor: BinlogPosition,
    base_version: int | None,
    plans: KeptPlans | None,
) -> int:
    """The base files with the changes after ``floor`` applied (module docstring); writes the
    new version's files and plan (to ``plans`` when nothing is written and it is given)."""
    storage.delete_tree(target.out_dir)
    columns = [c.name for c in target.table.columns]
    found = local.read_changes(segment_files(changes))
    rows, signs = (
        signed_rows(found, columns, target.schema, floor)
        if found is not None
        else (pa.table({}), np.zeros(0, np.int64))
    )
    slots = _Slots(target, base, rows, net_rows(rows, signs))
    parts = layout.version_parts(base, slots.sizes())
    small = layout.SMALL_FILE_BYTES if base_version is not None else 0
    groups = layout.group_parts(parts, small)
    writes = any(len(g) > 1 or parts[g[0]].kept is None for g in groups)
    files = _write(target, parts, groups, slots, shared=base_version is not None)
    plan = VersionPlan(base_version, tuple(sorted(slots.touched)), tuple(files))
    if plans is not None and not writes:
        plans.add(target.table.name, plan)
    else:
        layout.write_plan(target.out_dir, plan)
    if slots.touched:
        log.info(
            "table %s (no key): %d row change(s) after %s fall in %d slot(s); rewrote %d of %d "
            "file(s); version: %s",
            target.table.name,
            int(np.abs(signs).sum()),
            floor,
            len(slots.touched),
            sum(1 for _, r in base if r["file"] not in {f["file"] for f in files}),
            len(base),
            plan,
        )
    return plan.rows


def signed_rows(
    changes: pa.Table, columns: Sequence[str], schema: pa.Schema, floor: BinlogPosition
) -> tuple[pa.Table, np.ndarray]:
    """The rows the changes after ``floor`` remove (-1) and add (+1), in published types
    (``schema``), each change once: an insert adds its image, a delete removes its image (the
    before image), an update removes its before image (``_tm_old_<c>``) and adds its image.

    Raises:
        RunFailed: a change of an operation other than I, U, D.
    """
    changes = _after(changes, floor)
    op = changes.column(OP)
    unknown = pc.invert(pc.is_in(op, pa.array(["I", "U", "D"])))
    if pc.any(unknown).as_py():
        raise RunFailed(f"internal: a change of operation {op.filter(unknown)[0]} in a segment")
    updates = changes.filter(pc.equal(op, "U"))
    images = changes.select(columns)
    loose = pa.schema([f.with_nullable(True) for f in images.schema])  # old images are nullable
    removed = [
        images.filter(pc.equal(op, "D")).cast(loose),
        updates.select([OLD_PREFIX + c for c in columns]).rename_columns(columns).cast(loose),
    ]
    added = images.filter(pc.is_in(op, pa.array(["I", "U"]))).cast(loose)
    minus, plus = sum(t.num_rows for t in removed), added.num_rows
    both = pa.concat_tables([*removed, added])
    rows = pa.Table.from_batches(
        [to_published(b, schema) for b in both.to_batches()], schema=schema
    )
    signs = np.concatenate([np.full(minus, -1, np.int64), np.full(plus, 1, np.int64)])
    return rows, signs


def _after(changes: pa.Table, floor: BinlogPosition) -> pa.Table:
    """The changes after ``floor``, one per binlog position (a position seen twice counts once)."""
    file, pos, row = (changes.column(c).to_numpy() for c in POSITION)
    floor_file = file_index(floor.file)
    later = (file > floor_file) | ((file == floor_file) & (pos > floor.pos))
    order = np.lexsort((row, pos, file))
    ordered = np.stack([file[order], pos[order], row[order]])
    first = np.ones(len(order), dtype=bool)
    first[1:] = np.any(ordered[:, 1:] != ordered[:, :-1], axis=0)
    keep = np.zeros(len(order), dtype=bool)
    keep[order[first]] = True
    return changes.filter(pa.array(keep & later))


def net_rows(rows: pa.Table, signs: np.ndarray) -> list[Net]:
    """The net count of each distinct row among the signed ``rows`` (0: left out), in hash
    order. Rows of one hash are told apart by `row_identity`, never by the hash alone.

    >>> t = pa.table({"a": [1, 2, 1, 1], "b": ["x", "y", "x", "x"]})
    >>> [(n.index, n.count) for n in net_rows(t, np.array([1, -1, 1, -1]))] in (
    ...     [(0, 1), (1, -1)], [(1, -1), (0, 1)])
    True
    """
    if not rows.num_rows:
        return []
    hashes = row_hashes(rows)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    ends = np.append(starts[1:], len(order))
    lone = ends - starts == 1
    single = order[starts[lone]]
    out = [
        Net(h, i, n)
        for h, i, n in zip(
            ordered[starts[lone]].tolist(), single.tolist(), signs[single].tolist(), strict=True
        )
    ]
    shared = [(int(s), int(e)) for s, e in zip(starts[~lone], ends[~lone], strict=True)]
    if shared:
        indexes = np.concatenate([order[s:e] for s, e in shared])
        identities = {
            int(i): row_identity(list(r.values()))
            for i, r in zip(indexes, rows.take(pa.array(indexes)).to_pylist(), strict=True)
        }
        for s, e in shared:
            counts: dict[tuple[Any, ...], list[int]] = {}
            for i in order[s:e]:
                entry = counts.setdefault(identities[int(i)], [int(i), 0])
                entry[1] += int(signs[i])
            out += [Net(int(ordered[s]), i, n) for i, n in counts.values()]
    return sorted((n for n in out if n.count), key=lambda n: n.hash)


def _first(entry: FileRange) -> int:
    """A file's first hash (a file of a table without a key: ``min_key`` is ``[hash]``)."""
    assert entry["min_key"] is not None, "a file with rows has a first hash"
    return int(entry["min_key"][0])


def _last(entry: FileRange) -> int:
    assert entry["max_key"] is not None, "a file with rows has a last hash"
    return int(entry["max_key"][0])


def slots_of(hashes: np.ndarray, firsts: np.ndarray, last: int) -> np.ndarray:
    """The slot owning each hash (`orchestrator.lake.layout.territories`): ``-1`` below the first
    file, ``i`` from file ``i``'s first hash up to the next file's, ``n`` above the last file's
    last hash ``last``; 0 for all when there is no file.

    >>> u = lambda *v: np.array(v, np.uint64)
    >>> slots_of(u(1, 5, 7, 9, 12, 13), u(5, 9), 12).tolist()
    [-1, 0, 0, 1, 1, 2]
    >>> slots_of(u(3), u(), 0).tolist()
    [0]
    """
    if not len(firsts):
        return np.zeros(len(hashes), np.int64)
    slots = np.searchsorted(firsts, hashes, side="right").astype(np.int64) - 1
    slots[(slots == len(firsts) - 1) & (hashes > np.uint64(last))] = len(firsts)
    return slots


class _Slots:
    """The run's net changes by slot of the base files, and each rewritten slot's rows."""

    def __init__(
        self, target: Target, base: Sequence[BaseFile], rows: pa.Table, nets: Sequence[Net]
    ) -> None:
        self.target, self.base, self.rows = target, base, rows
        firsts = np.array([_first(r) for _, r in base], dtype=np.uint64)
        last = _last(base[-1][1]) if base else 0
        self.by_slot: dict[int, list[Net]] = {}
        slots = slots_of(np.array([n.hash for n in nets], np.uint64), firsts, last)
        for net, slot in zip(nets, slots.tolist(), strict=True):
            self.by_slot.setdefault(slot, []).append(net)

    @property
    def touched(self) -> list[int]:
        return sorted(self.by_slot)

    def sizes(self) -> dict[int, tuple[int, int]]:
        """Each rewritten slot's rows after the changes, and its bytes (estimated)."""
        rows = sum(r["rows"] for _, r in self.base)
        per_row = sum(r["bytes"] for _, r in self.base) / rows if rows else 100.0
        out = {}
        for slot, nets in self.by_slot.items():
            had = self.base[slot][1]["rows"] if 0 <= slot < len(self.base) else 0
            count = had + sum(n.count for n in nets)
            out[slot] = (count, round(count * per_row))
        return out

    def rows_of(self, part: Part) -> tuple[pa.Table, np.ndarray]:
        """A part's rows and their hashes, in hash order: a kept file as it is, a rewritten
        slot's base file with its changes."""
        schema = self.target.schema
        uri = part.uri
        base = (
            pa.Table.from_batches(list(read_published(uri, schema)), schema=schema)
            if uri
            else schema.empty_table()
        )
        hashes = row_hashes(base)
        if part.slot is None:
            return base, hashes
        return self._changed(base, hashes, self.by_slot.get(part.slot, []))

    def _changed(
        self, base: pa.Table, hashes: np.ndarray, nets: Sequence[Net]
    ) -> tuple[pa.Table, np.ndarray]:
        """The slot's base rows (sorted by ``hashes``) less the removals, plus the additions,
        in hash order (a merge: one copy of the rows)."""
        keep = np.ones(base.num_rows, dtype=bool)
        removals = [n for n in nets if n.count < 0]
        if removals:
            keep[self._removed(base, hashes, removals)] = False
        adds = [n for n in nets if n.count > 0]  # in hash order, as `net_rows` gives them
        counts = [n.count for n in adds]
        picks = np.repeat(np.array([n.index for n in adds], np.int64), counts)
        added_hashes = np.repeat(np.array([n.hash for n in adds], np.uint64), counts)
        kept = np.flatnonzero(keep)
        at = np.searchsorted(hashes[kept], added_hashes, side="right")
        order = np.insert(kept, at, base.num_rows + np.arange(len(picks), dtype=np.int64))
        rows = pa.concat_tables([base, self.rows.take(pa.array(picks, pa.int64()))])
        merged_hashes = np.insert(hashes[kept], at, added_hashes)
        return rows.take(pa.array(order, pa.int64())), merged_hashes

    def _removed(self, base: pa.Table, hashes: np.ndarray, removals: Sequence[Net]) -> list[int]:
        """The base rows that go: for each removal, as many rows identical to its row.

        Raises:
            RunFailed: the base holds fewer rows identical to one than the changes remove.
        """
        wanted = np.array([n.hash for n in removals], np.uint64)
        candidates = np.flatnonzero(np.isin(hashes, wanted))
        found = base.take(pa.array(candidates, pa.int64())).to_pylist()
        held: dict[tuple[Any, ...], list[int]] = {}
        for i, row in zip(candidates, found, strict=True):
            held.setdefault(row_identity(list(row.values())), []).append(int(i))
        images = self.rows.take(pa.array([n.index for n in removals], pa.int64())).to_pylist()
        out: list[int] = []
        for net, row in zip(removals, images, strict=True):
            same = held.get(row_identity(list(row.values())), [])
            if len(same) < -net.count:
                raise RunFailed(
                    f"table {self.target.table.name}: the binlog removes {-net.count} row(s) "
                    f"{_short(row)} but the lake holds {len(same)} (it has no key: rows "
                    "count); " + resnapshot_hint(self.target.table.name)
                )
            out += same[: -net.count]
        return out


def _short(row: Mapping[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in row.items())
    return f"({text[:200]}{'...' if len(text) > 200 else ''})"


def _write(
    target: Target,
    parts: Sequence[Part],
    groups: Sequence[Sequence[int]],
    slots: _Slots,
    *,
    shared: bool,
) -> list[PlannedFile]:
    """The version's files in hash order: a group that is one kept part stays as it is, every
    other group is written to new files in ``target.out_dir``, groups in parallel."""

    def write(index: int, members: list[Part]) -> list[FileRange]:
        loaded = [slots.rows_of(p) for p in members]
        rows = pa.concat_tables([r for r, _ in loaded])
        hashes = np.concatenate([h for _, h in loaded]) if loaded else np.zeros(0, np.uint64)
        per_file = layout.piece_rows(
            rows.num_rows, sum(p.bytes for p in members), layout.TARGET_FILE_BYTES
        )
        return write_sorted(
            lambda n: storage.join(target.out_dir, f"g{index:06d}-{n:04d}.parquet"),
            rows,
            hashes,
            per_file,
        )

    jobs: list[PlannedFile | Future[list[FileRange]]] = []
    with ThreadPoolExecutor(
        max(1, os.cpu_count() or 1), thread_name_prefix="tidemark-write"
    ) as pool:
        for index, group in enumerate(groups):
            members = [parts[i] for i in group]
            kept = members[0].kept
            if len(members) == 1 and kept is not None:
                jobs.append(layout.planned(kept, kept["file"], shared))
            else:
                jobs.append(pool.submit(write, index, members))
        out: list[PlannedFile] = []
        for job in jobs:
            if not isinstance(job, Future):
                out.append(job)
                continue
            out += [layout.planned(w, w["file"], False) for w in job.result()]
    return out
