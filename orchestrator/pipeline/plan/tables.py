"""Each table of a run planned: incremental from its published position when that can go on
(the binlog since is still on the server or found by GTID, the table has the shape it was
published with, ``current.json`` is not behind the checkpoint), else a snapshot of chunks
(`orchestrator.pipeline.plan.chunks`) after ``P0``'s margin. A table re-read inside a run
(`replan_snapshot`) is planned again from a start position of its own, ``P0_T``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chunking import TablePlan, chunk_predicate, encode_key
from orchestrator.binlog.failover import Follower
from orchestrator.config import PipelineConfig, TableConfig
from orchestrator.errors import RunFailed, StateError
from orchestrator.lake.manifest import Manifest, Manifests, find_manifest
from orchestrator.pipeline.capture.filtering import compile_table_filter
from orchestrator.pipeline.capture.xa import XA_FOREIGN, XA_KNOWN
from orchestrator.pipeline.context import open_source, table_dir
from orchestrator.pipeline.failed import fail_table, table_failure
from orchestrator.pipeline.lines import TableLines
from orchestrator.pipeline.plan.batches import Draft, assign_batches
from orchestrator.pipeline.plan.cascades import table_cascades
from orchestrator.pipeline.plan.chunks import check_escaping, plan_table
from orchestrator.pipeline.segments import void_mark
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.schema.tables import TableInfo, table_info_text, unkept
from orchestrator.schema.types import arrow_type
from orchestrator.source.connection import Source
from orchestrator.source.listing import Shapes, tables_info
from orchestrator.state.store import (
    ChunkRecord,
    PlannedTable,
    RunRecord,
    StateStore,
    TableCheckpoint,
)

log = logging.getLogger("tidemark.planning")

#: Tables planned before they are recorded, in one transaction with their chunks.
FLUSH_TABLES = 500


def plan_tables(
    config: PipelineConfig,
    store: StateStore,
    run: RunRecord,
    failing: dict[str, str],
    shapes: Shapes | None = None,
) -> None:
    """Plan every table of the run not planned yet (all of them on a fresh run), recording them
    `FLUSH_TABLES` at a time, each time in one transaction with their chunks in batches. A run
    of no table (a pattern that matches none yet) plans nothing.

    The tables' shapes are read after ``P0``: a DDL statement after it is in the binlog the run
    applies. ``shapes`` (preflight's, in this process) were read after their position: a run
    without ``P0`` records that position as ``P0``, and a run with one recorded it before this
    process started, so either may plan with them; a table they lack is read here."""
    options = run.options
    effective = config.with_chunk_size(options.get("chunk_size"))
    planned = {table for table, _, _ in store.run_table_states(run.run_id)}
    names = [name for name in options.get("tables", []) if name not in planned]
    if not names:
        return
    todo = list(effective.select_tables(names))
    with open_source(config) as source:
        # A table planned into a run whose capture has begun (it was reset meanwhile) starts at
        # its own position: the capture goes on from its checkpoint, after the run's P0.
        late = store.capture_checkpoint(run.run_id) is not None or run.high_position is not None
        if run.start_position is None:
            start = shapes.position if shapes is not None else source.current_position()
            store.set_run_positions(run.run_id, start=start.to_json())
            log.info("run %s: start position P0 = %s", run.run_id, start)
            run = store.get_run(run.run_id)
        margin = _Margin(
            config.defaults.read_margin_seconds
        )  # before any key bound: see the docstring
        oldest = source.oldest_binlog()
        check_escaping(source.query)
        follower = Follower(config, source)
        checkpoints = {cp.table: cp for cp in store.table_checkpoints(config.pipeline)}
        cascades = table_cascades(
            config,
            source,
            [t.name for t in todo if t.name not in failing],
            shapes.infos if shapes is not None and not late else None,
        )
        lines = TableLines(log)
        for first in range(0, len(todo), FLUSH_TABLES):
            part = todo[first : first + FLUSH_TABLES]
            infos = (
                {}
                if late
                else _shapes(source, [t.name for t in part if t.name not in failing], shapes)
            )
            drafts: list[PlannedTable | Draft] = []
            published = (
                table_dir(config, t.name)
                for t in part
                if t.name not in failing and t.name in checkpoints and _goes_on(run, late=late)
            )
            with Manifests(published) as manifests:
                for table in part:
                    blocked = cascades.get(table.name, {}).get("blocked")
                    if table.name in failing or blocked:
                        why = failing.get(table.name) or str(blocked)
                        fail_table(store, run.run_id, table.name, "plan", why)
                        continue
                    try:
                        drafts.append(
                            _plan_one(
                                config,
                                store,
                                run,
                                table,
                                source,
                                oldest,
                                follower,
                                infos.get(table.name),
                                checkpoints.get(table.name),
                                late=late,
                                margin=margin,
                                find=manifests.find,
                            )
                        )
                    except Exception as exc:  # one table's trouble is its own (`pipeline.failed`)
                        reason = table_failure(exc)
                        if reason is None:
                            raise
                        fail_table(store, run.run_id, table.name, "plan", reason)
            for draft in drafts:
                made = draft.plan if isinstance(draft, Draft) else draft
                if made.table in cascades:
                    made.info["cascades"] = cascades[made.table]
            _record(config, store, run.run_id, drafts, lines)
        lines.flush()


def _shapes(source: Source, names: list[str], shapes: Shapes | None) -> dict[str, TableInfo]:
    """The shapes of ``names``: those ``shapes`` hold, the others read now."""
    if shapes is None:
        return tables_info(source, names)
    held, unread = shapes.pick(names)
    return held | tables_info(source, unread) if unread else held


def _record(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    drafts: list[PlannedTable | Draft],
    lines: TableLines,
) -> None:
    """Record planned tables in one transaction, the snapshots' chunks in batches; the
    incremental ones' lines go to ``lines`` (thousands planned from one position: one line)."""
    snapshots = [d for d in drafts if isinstance(d, Draft)]
    next_batch = max(store.batches(run_id), default=-1) + 1
    batched = iter(assign_batches(snapshots, next_batch, config.defaults))
    plans = [next(batched) if isinstance(d, Draft) else d for d in drafts]
    store.add_run_tables(run_id, plans)
    for p in plans:
        if p.mode == "snapshot":
            batches = len({c.batch for c in p.chunks})
            log.info(
                "table %s: snapshot, %d chunks in %d batch(es)", p.table, len(p.chunks), batches
            )
        else:
            since = BinlogPosition.from_json(p.info["from_position"])
            lines.add(
                p.table,
                f"incremental from {since} (published version {p.info['base_version']})",
                f"incremental from {since}",
            )


def _plan_one(
    config: PipelineConfig,
    store: StateStore,
    run: RunRecord,
    table: TableConfig,
    source: Source,
    oldest: str | None,
    follower: Follower,
    info: TableInfo | None,
    checkpoint: TableCheckpoint | None,
    *,
    late: bool,
    margin: _Margin,
    find: Callable[[str], Manifest | None] = find_manifest,
) -> PlannedTable | Draft:
    """Plan one table of the run: incremental from its published position (its manifest read by
    ``find``), or a snapshot."""
    start = source.current_position().to_json() if late else None  # before the table is looked at
    if late:  # its own P0_T wants the same margin before any key bound is read
        time.sleep(config.defaults.read_margin_seconds)
    info = info or source.table_info(table.name)  # not found in bulk: it says why
    if table.where:  # the binlog must evaluate it exactly (refused before any read)
        compile_table_filter(table.where, info, None)
    if checkpoint is not None and _goes_on(run, late=late):
        manifest = find(table_dir(config, table.name))
        since = (
            _published_start(
                follower, table.name, checkpoint, oldest, exact=_keyless_version(manifest)
            )
            if _not_behind(table.name, manifest, checkpoint.version)
            else None
        )
        if (
            since is not None
            and _same_shape(table.name, manifest, info)
            and _version_holds(config.pipeline, store, table.name, since, checkpoint, manifest)
        ):
            assert manifest is not None, "_not_behind: there is one"
            version = _held_before(since, checkpoint, manifest)
            marks = _xa_marks(since, checkpoint)
            return _incremental(table, manifest, info, since.to_json(), marks, version=version)
    # Changes the run captured for it before it was reset would override the new read: they are
    # voided in the same transaction that plans it (`pipeline.segments`).
    void = void_mark(store, run.run_id) if late else 0
    if not late:  # P0's margin, before the first key bound of the run is read
        margin.wait()
    return _snapshot_draft(config, run, table, info, source, start=start, void=void)


def _goes_on(run: RunRecord, *, late: bool) -> bool:
    """Whether the run's tables with a checkpoint may go on from their published versions: they
    are planned with the run (not late), and the run does not snapshot every table."""
    return not late and not run.options.get("snapshot")


@dataclass(slots=True)
class _Margin:
    """``read_margin_seconds`` after ``P0``, waited once, before the first key bound of the run is
    read (see the module docstring): what planning does meanwhile (the tables' shapes, the
    published checkpoints) counts towards it, since the margin runs from ``P0`` (made after it).
    A run whose tables are all incremental reads no key bound and does not wait: their changes
    come from the binlog, whatever readers could see at ``P0``."""

    seconds: float
    waited: bool = False
    started: float = field(default_factory=time.monotonic)

    def wait(self) -> None:
        if not self.waited:
            time.sleep(max(0.0, self.started + self.seconds - time.monotonic()))
            self.waited = True


def _not_behind(table: str, manifest: Manifest | None, version: int) -> bool:
    """Whether ``current.json`` names at least the version the table's checkpoint records. It
    always does, unless a process that lost the pipeline lock replaced it in the instant after
    its last fence check (docs/design.md "One writer"): the changes since the checkpoint's
    position would then be applied to an older version, and only a re-read is exact."""
    if manifest is not None and manifest["version"] >= version:
        return True
    log.warning(
        "table %s: current.json names version %s, older than version %d the state store "
        "published: re-read",
        table,
        manifest["version"] if manifest else "none",
        version,
    )
    return False


def _version_holds(
    pipeline: str,
    store: StateStore,
    table: str,
    since: BinlogPosition,
    checkpoint: TableCheckpoint,
    manifest: Manifest | None,
) -> bool:
    """Whether ``current.json``'s version can take the changes from ``since``: it is the source
    at ``since`` or later (replaying from before a version is exact; from after it misses what
    changed between). A version of the pipeline's own runs always is: the checkpoint's, or a
    later one whose record a crash took back. One another writer published (another pipeline
    given the same table and lake, whose state store or name this one does not share) may be
    older than ``since``: it holds only if its position is at or after ``since`` on the same
    server; otherwise the table is re-read. Either way a WARNING says so."""
    assert manifest is not None, "_not_behind: there is one"
    run_id = manifest.get("run_id")
    if run_id == checkpoint.run_id or _runs_of(store, pipeline, run_id):
        return True
    version = BinlogPosition.from_json(dict(manifest["position"]))
    holds = version.before(since) is False
    log.warning(
        "table %s: its current version %d (at %s) was published by run %s, which is not one of "
        "pipeline %s's: is another pipeline writing this table? (each table belongs in one "
        "pipeline's output). %s",
        table,
        manifest["version"],
        version,
        run_id,
        pipeline,
        f"It is at or after {since}, where this pipeline's version goes on: applied on it"
        if holds
        else f"It may be older than {since}, where this pipeline's version goes on: re-read",
    )
    return holds


def _runs_of(store: StateStore, pipeline: str, run_id: str | None) -> bool:
    """Whether ``run_id`` is a run of ``pipeline`` in ``store``."""
    if not run_id:
        return False
    try:
        return store.get_run(run_id).pipeline == pipeline
    except StateError:  # not in this state store
        return False


def _keyless_version(manifest: Manifest | None) -> bool:
    """Whether the published version is of a table without a key (its changes count)."""
    return manifest is not None and not manifest["chunk_key"]


def _published_start(
    follower: Follower,
    table: str,
    checkpoint: TableCheckpoint,
    oldest: str | None,
    *,
    exact: bool = False,
) -> BinlogPosition | None:
    """Where on the source the table's published version goes on from; None when it must be
    read again (the position is another server's and its GTID set cannot be found here, or
    the binlog since was purged). ``exact``: the table's changes must each be applied exactly
    once (a table without a key), so a position carried over from another server by its GTID
    set, after which some changes may come again, is read again too."""
    placed = follower.place(BinlogPosition.from_json(checkpoint.position))
    if placed.position is None:
        log.warning("table %s: re-read (version %d): %s", table, checkpoint.version, placed)
        return None
    if exact and placed.how == "moved":
        log.warning(
            "table %s: re-read (version %d): it has no key, and changes after %s may come again "
            "on this server, which would count them twice",
            table,
            checkpoint.version,
            placed,
        )
        return None
    if oldest is not None and file_index(placed.position.file) < file_index(oldest):
        log.warning(
            "table %s: the binlog since its version %d (%s) was purged (oldest kept: "
            "%s); it is snapshotted again",
            table,
            checkpoint.version,
            placed.position.file,
            oldest,
        )
        return None
    return placed.position


def _same_shape(table: str, manifest: Manifest | None, info: TableInfo) -> bool:
    """Whether the table has the columns of its published version, with the types they were
    published as; if not, it is re-read (its changes since then cannot be applied to rows of
    another shape, nor to files of another type: a TINYINT(1) that joined a key)."""
    assert manifest is not None, "a published table has a manifest"
    published = [(c["name"], c["mysql_type"], c.get("arrow_type")) for c in manifest["columns"]]
    current = [(c.name, c.column_type, str(arrow_type(c))) for c in info.columns]
    if published != current:
        log.warning(
            "table %s: columns changed since version %d (%s -> %s): re-read",
            table,
            manifest["version"],
            published,
            current,
        )
    return published == current


def _held_before(
    since: BinlogPosition, checkpoint: TableCheckpoint, manifest: Manifest
) -> dict[str, Any] | None:
    """The published version's position when the table's start ``since`` is its checkpoint's,
    held back before that version for an XA transaction (`orchestrator.pipeline.capture.xa`),
    on the binlog of the server that wrote both; else None. The capture then reads from
    ``since``, to see the transaction begin, and keeps only what lies after the version
    (`orchestrator.pipeline.capture.buffer.CaptureTable`, ``read_from``). A start carried over
    from another server, or positions that do not name their server, keep everything from
    ``since`` (applying again what the version has is exact, docs/design.md)."""
    recorded = BinlogPosition.from_json(checkpoint.position)
    version = BinlogPosition.from_json(dict(manifest["position"]))
    if since.key != recorded.key or since.before(version) is not True:
        return None
    return dict(manifest["position"])


def _xa_marks(since: BinlogPosition, checkpoint: TableCheckpoint) -> dict[str, Any]:
    """What the capture that made the checkpoint recorded of XA transactions with it
    (`orchestrator.pipeline.capture.xa`): whether it held the start back for a transaction of
    other tables (``held_back``), and, for a start that is the checkpoint's own, the
    transactions it knows the commit of (`XA_KNOWN`). A start carried over from another server
    knows none.

    >>> from orchestrator.state.records import TableCheckpoint as C
    >>> at = {"file": "b.000001", "pos": 400}
    >>> c = C("p", "db.t", 1, {**at, XA_FOREIGN: True, XA_KNOWN: ["1:61:"]}, 1, "m", "r", None)
    >>> _xa_marks(BinlogPosition.from_json(at), c)  # type: ignore[arg-type]
    {'held_back': True, 'xa_known': ['1:61:']}
    >>> _xa_marks(BinlogPosition("b.000002", 4), c)  # type: ignore[arg-type]
    {'held_back': True}
    """
    marks: dict[str, Any] = {"held_back": True} if checkpoint.position.get(XA_FOREIGN) else {}
    own = since.key == BinlogPosition.from_json(checkpoint.position).key
    if own and checkpoint.position.get(XA_KNOWN):
        marks[XA_KNOWN] = list(checkpoint.position[XA_KNOWN])
    return marks


def _incremental(
    table: TableConfig,
    manifest: Manifest,
    info: TableInfo,
    since: dict[str, Any],
    marks: dict[str, Any],
    *,
    version: dict[str, Any] | None = None,
) -> PlannedTable:
    """``marks``: `_xa_marks`; ``version``: `_held_before`."""
    return PlannedTable(
        table.name,
        "incremental",
        None,
        list(manifest["chunk_key"]),
        {
            "table_info": table_info_text(info),
            "from_position": since,
            "base_version": manifest["version"],
            **marks,
            **({"version_position": version} if version is not None else {}),
        },
        [],
    )


def replan_snapshot(
    config: PipelineConfig,
    store: StateStore,
    run_id: str,
    table: str,
    source: Source,
    reason: dict[str, Any],
    known: list[str] | None = None,
) -> None:
    """Plan a table of the run again as a snapshot starting now (a re-read inside the run).

    Its new start position ``P0_T`` is recorded before any key bound is read, as ``P0`` is. Its
    change segments captured so far are voided in the transaction that replaces its plan.
    ``known``: the XA transactions its plan knew to hold nothing of it (``xa_known``,
    `orchestrator.pipeline.capture.xa`): what they hold does not depend on where the table is
    read from, so the snapshot knows them too.
    """
    run = store.get_run(run_id)
    start = source.current_position()
    time.sleep(config.defaults.read_margin_seconds)  # P0_T's margin, as P0's
    table_config = config.with_chunk_size(run.options.get("chunk_size")).table(table)
    info = source.table_info(table)
    elsewhere = unkept(info)
    if elsewhere is not None:  # an ALTER made it one: the run's checks did not see it
        raise RunFailed(
            f"{table} is now {elsewhere}; no run could keep it equal to the source: leave it "
            "out of the pipeline (docs/limits.md)"
        )
    draft = _snapshot_draft(
        config,
        run,
        table_config,
        info,
        source,
        start=start.to_json(),
        reread={**reason, "from": start.to_json()},
        void=void_mark(store, run_id),
    )
    cascades = table_cascades(config, source, [table])
    if table in cascades:
        draft.plan.info["cascades"] = cascades[table]
    if known:
        draft.plan.info[XA_KNOWN] = known
    next_batch = max(store.batches(run_id), default=-1) + 1
    p = assign_batches([draft], next_batch, config.defaults)[0]
    store.add_run_table(
        run_id,
        p.table,
        "snapshot",
        strategy=p.strategy,
        chunk_key=p.chunk_key,
        info=p.info,
        chunks=p.chunks,
        replan=True,
    )
    log.info("table %s: re-read from %s", table, start)


def _snapshot_draft(
    config: PipelineConfig,
    run: RunRecord,
    table: TableConfig,
    info: TableInfo,
    source: Source,
    *,
    start: dict[str, Any] | None = None,
    reread: dict[str, Any] | None = None,
    void: int = 0,
) -> Draft:
    table_plan = plan_table(
        source.query,
        table,
        info,
        config.defaults,
        check_mode=False,
        time_zone=config.source.time_zone,
    )
    chunks = [
        ChunkRecord(
            run_id=run.run_id,
            table=table.name,
            index=chunk.index,
            batch=-1,
            start=encode_key(chunk.range.start),
            end=encode_key(chunk.range.end),
            where=chunk_predicate(table_plan.chunk_key, chunk.range, info.columns, table.where),
            status="pending",
            low=None,
            high=None,
            rows=None,
            bytes=None,
            path=None,
            attempts=0,
        )
        for chunk in table_plan.chunks
    ]
    plan = PlannedTable(
        table.name,
        "snapshot",
        table_plan.strategy,
        list(table_plan.chunk_key),
        {
            "table_info": table_info_text(info),
            "from_position": start or run.start_position,
            "stats": table_plan.stats,
            **({"reread": reread} if reread else {}),
            **({"segments_after": void} if void else {}),
            **(
                {"keyless": _keyless_settings(table, table_plan)}
                if not table_plan.chunk_key
                else {}
            ),
        },
        chunks,
    )
    return Draft(plan, int(table_plan.stats.get("rows") or 0), table.batch_chunks)


def _keyless_settings(table: TableConfig, plan: TablePlan) -> dict[str, Any]:
    """What the read of a table without a key needs (`orchestrator.pipeline.read.keyless`)."""
    return {
        "rows": plan.stats.get("rows"),
        "rows_per_file": table.chunk_size,
        "lock": table.keyless_lock,
    }
