"""A reconciled table becomes a new immutable version behind an atomic manifest switch (the
publish step, `orchestrator.pipeline.publish.step`, does this for each table of a run).

Layout and manifest are docs/output.md, "Output layout"; every version is also an
Iceberg snapshot (`orchestrator.lake.iceberg`). Each publish attempt has a tag of its
own (`storage.attempt_tag`) that names every file it writes. Order of writes:

1. the Iceberg table's schema evolution or creation is prepared (nothing committed), which fixes
   the field IDs;
2. the version's new data files ``data/v000002-<tag>-c0000.parquet`` ...: the files reconcile
   finished in staging (`orchestrator.lake.layout.VersionPlan`), each one key range in key
   order, moved into ``data/`` (a rename; a file whose field IDs are not the table's is
   written anew). ``<tag>`` names the reconcile attempt whose files they are (every attempt
   of this publish moves them to the same names, so a move a crash cut is finished, never
   repeated). After an incremental reconcile only the rewritten ranges are new and every
   other file of the previous version is shared (listed again, never copied);
3. the version's manifest (without its ``iceberg`` entry yet) in the run's staging, one file
   ``pending/<attempt>.json`` for the tables a worker publishes together (`publish_tables`:
   their attempt is one), fsynced once for them all;
4. the Iceberg snapshot: the files of the version, the run id and the attempt in its
   summary, any schema change of 1 with it; the catalog commits it only on the parent snapshot
   the attempt loaded (a new table: created in this same commit, only if no table of its name
   exists);
5. ``_tidemark/versions/000002.json`` and ``_tidemark/current.json``, replaced
   atomically (`storage.write_atomic`): the moment Tidemark's readers switch;
6. retention: versions beyond ``output.keep_versions`` and older than
   ``output.keep_hours`` are dropped, their Iceberg snapshots expired, with the
   files no kept version or snapshot references, and what attempts that never
   switched left behind (`manifest.apply_retention`).

A crash before 4 leaves the previous version current and some unreferenced files;
the rerun takes the files already moved (their staging file is gone) and moves the rest,
and retention deletes what a crashed attempt left once that version is current. A crash between
4 and 5 is found by the rerun (a snapshot carries its run id and attempt): it
completes 5 from that attempt's manifest of 3 without committing again (the run's staging is
kept until the run is finished, or left behind and never resumed; an attempt of a release
before kept it in the table's ``_tidemark/pending/``, where the rerun looks too). A crash
after 5 is detected by the rerun (``current.json`` already carries the run id)
and returns the published manifest.

Every write and delete is preceded by the fence check (``guard``): a process that
lost the pipeline lock stops before it touches the lake. Files of an attempt are
never overwritten or deleted by another attempt while anything may list them, so a
stale process paused past its check cannot spoil what the lock's new owner publishes
(docs/design.md, "One writer").
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pyiceberg.catalog import Catalog

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import iceberg, iceberg_commit, iceberg_create, layout, storage
from orchestrator.lake.iceberg_create import NewTable
from orchestrator.lake.manifest import (
    IcebergEntry,
    Manifest,
    PositionEntry,
    column_entries,
    load_manifest,
    load_pending,
    pending_uri,
    published_schema,
    version_uri,
)
from orchestrator.lake.writer import VersionWriter
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.publish.staging import (
    fresh_attempt,
    moved_tag,
    pending_file,
    place,
    write_pending,
)
from orchestrator.pipeline.publish.switch import retain, switch
from orchestrator.pipeline.publish.unchanged import (
    Publishing,
    check_base,
    check_not_newer,
    kept_version,
    seen,
)
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo
from orchestrator.services import faults

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- publish


def publish_table(
    config: PipelineConfig,
    table_info: TableInfo,
    key: Sequence[str],
    reconciled_dir: str,
    position: BinlogPosition,
    run_id: str,
    guard: Callable[[], None] = lambda: None,
    catalog: Catalog | None = None,
) -> Manifest:
    """Publish a reconciled table as the next version and switch its manifest to it.

    Args:
        config: the pipeline config (``output.path``, ``output.keep_versions``).
        table_info: the table's columns.
        key: the chunk key, recorded in the manifest.
        reconciled_dir: a reconcile's `layout.VersionPlan` and new data files, or staging
            Parquet files that make the whole table at ``position``, in key order.
        position: ``H``, the binlog position the data equals the source at.
        run_id: the run publishing; publishing the same run again returns its manifest.
        guard: the fence check (`StateStore.check_fence`), run before every write and
            delete in the lake: a process that lost the pipeline lock stops there.
        catalog: the Iceberg catalog, opened once for many tables (default: opened here).

    Returns:
        The manifest now in ``current.json``.
    """
    [done] = publish_tables(
        config,
        [Publishing(table_info, tuple(key), reconciled_dir, position)],
        run_id,
        guard,
        catalog,
    )
    if isinstance(done, Exception):
        raise done
    return done


def publish_tables(
    config: PipelineConfig,
    tables: Sequence[Publishing],
    run_id: str,
    guard: Callable[[], None] = lambda: None,
    catalog: Catalog | None = None,
) -> list[Manifest | Exception]:
    """`publish_table` of each of ``tables``: its manifest, or the exception its publish raised
    (the others are published all the same).

    Tables new to the catalog are created together: each one's version is written up to its
    Iceberg commit (the order of writes above), then the catalog registers them all in one
    transaction (`iceberg_create.register_all`), then each switches. A group of tables asks
    the catalog which of them it has in one query instead of loading each (a table it does not
    have has no snapshot of this run to find)."""

    @functools.cache
    def catalog_() -> Catalog:  # opened once, and only when a table needs it
        return catalog or iceberg.open_catalog(config)

    @functools.cache
    def known() -> set[str] | None:
        return iceberg_create.known(catalog_(), [t.table_info.name for t in tables])

    def exists(name: str) -> bool | None:
        if len(tables) == 1:
            return None  # looked up by loading it: one query as well
        found = known()
        return None if found is None else name in found

    out: list[Manifest | Exception | None] = [None] * len(tables)
    staged: list[tuple[int, _Staged]] = []
    # The tag naming every file these tables' publish writes: drawn once a table writes one.
    attempt = functools.cache(lambda: fresh_attempt(config, run_id))
    for i, table in enumerate(tables):
        try:
            step = _stage(config, table, run_id, guard, catalog_, exists, attempt)
        except (
            Exception
        ) as exc:  # that table's; the caller tells a table's own failure from the run's
            out[i] = exc
            continue
        if isinstance(step, _Staged):
            staged.append((i, step))
        else:
            out[i] = step
    try:
        write_pending(
            config, run_id, attempt, {step.table: step.manifest for _, step in staged}, guard
        )
    except Exception as exc:  # no table of them is committed without its manifest
        for i, _ in staged:
            out[i] = exc
        staged = []
    created = _create_new(
        catalog_, [(i, s) for i, s in staged if isinstance(s.prepared, NewTable)], guard
    )
    for i, step in staged:
        try:
            if i in created:
                entry = created[i]
            else:
                assert not isinstance(step.prepared, NewTable), "created above"
                entry = iceberg_commit.commit_version(
                    catalog_(),
                    step.table,
                    step.tdir,
                    step.manifest["files"],
                    version=step.manifest["version"],
                    run_id=run_id,
                    position=step.position,
                    attempt=step.attempt,
                    guard=guard,
                    prepared=step.prepared,
                )
            if isinstance(entry, Exception):
                raise entry
            faults.point("publish.iceberg_committed")
            log.debug(
                "table %s: switching to version %d (%d rows, %d files) at %s",
                step.table,
                step.manifest["version"],
                step.manifest["rows"],
                len(step.manifest["files"]),
                step.position,
            )
            out[i] = switch(
                config, catalog_(), step.tdir, step.manifest, entry, guard, step.previous
            )
        except Exception as exc:
            out[i] = exc
    return [o if o is not None else RunFailed("internal: a table was not published") for o in out]


@dataclass(frozen=True, slots=True)
class _Staged:
    """A version written up to its Iceberg commit: its data files in place, its manifest pending."""

    table: str
    tdir: str
    manifest: Manifest
    attempt: str
    position: BinlogPosition
    prepared: iceberg.Prepared | None  # None: load the table again to commit
    previous: Manifest | None  # the version current when publish began, as it read it


def _create_new(
    catalog: Callable[[], Catalog], staged: Sequence[tuple[int, _Staged]], guard: Callable[[], None]
) -> dict[int, IcebergEntry | Exception]:
    """The tables new to the catalog created together (`iceberg_create.create_all`)."""
    if not staged:
        return {}
    creating: list[iceberg_create.Creating] = []
    for _, step in staged:
        assert isinstance(step.prepared, NewTable)
        creating.append(
            (
                step.prepared,
                iceberg_commit.file_uris(step.tdir, step.manifest["files"]),
                iceberg_commit.summary(
                    run_id=step.manifest["run_id"],
                    version=step.manifest["version"],
                    attempt=step.attempt,
                    position=step.position,
                ),
            )
        )
    out: dict[int, IcebergEntry | Exception] = {}
    for (i, step), done in zip(
        staged, iceberg_create.create_all(catalog(), creating, guard), strict=True
    ):
        out[i] = (
            done
            if isinstance(done, Exception)
            else IcebergEntry(
                catalog=catalog().name,
                identifier=step.table,
                metadata_location=done[0],
                snapshot_id=done[1],
            )
        )
    return out


def _stage(
    config: PipelineConfig,
    table: Publishing,
    run_id: str,
    guard: Callable[[], None],
    catalog_: Callable[[], Catalog],
    exists: Callable[[str], bool | None],
    attempt: Callable[[], str],
) -> Manifest | _Staged:
    """``table``'s version written up to its Iceberg commit but for its pending manifest
    (`write_pending`), or its manifest when there is nothing to commit (no change, published
    already, or a committed snapshot of the run found and switched to). ``exists``: whether the
    catalog lists a table (None: look it up); ``attempt``: the publish attempt's tag."""
    table_info, key, reconciled_dir, position = (
        table.table_info,
        table.key,
        table.reconciled_dir,
        table.position,
    )
    # No slot rewritten: nothing of this run was committed, and the catalog need not be opened.
    table = replace(table, seen=seen(config, table))  # current.json and the plan: read once
    kept = kept_version(config, table, run_id)
    if kept is not None:
        return kept
    tdir = table_dir(config, table_info.name)
    assert table.seen is not None
    current, plan = table.seen.current, table.seen.plan
    catalog = catalog_()
    if current is not None and current["run_id"] == run_id:
        log.info(
            "table %s: version %d of run %s is already published",
            table_info.name,
            current["version"],
            run_id,
        )
        retain(config, catalog, tdir, current, guard)
        return current
    # once: a crashed attempt may have committed (find_run_in)
    loaded = (
        iceberg.load(catalog, table_info.name) if exists(table_info.name) is not False else None
    )
    committed = iceberg_commit.find_run_in(catalog, table_info.name, loaded, run_id)
    recovered = (
        _committed_manifest(config, run_id, table_info.name, tdir, committed)
        if committed is not None
        else None
    )
    if committed is not None and recovered is not None:
        log.info(
            "table %s: %s of run %s is committed; switching the manifest to it",
            table_info.name,
            committed,
            run_id,
        )
        return switch(config, catalog, tdir, recovered, committed.entry, guard)
    version = current["version"] + 1 if current is not None else 1
    check_not_newer(table_info.name, current, position)
    if plan is not None and plan.base_version is not None:
        current = check_base(table_info.name, current, plan)
    guard()
    schema, prepared = iceberg.prepare_table(
        catalog, table_info.name, tdir, published_schema(table_info.columns), loaded
    )
    storage.makedirs_durable(storage.join(tdir, layout.DATA_DIR))
    writer = VersionWriter(
        tdir, version, schema, [table_info.column(k).name for k in key], attempt()
    )
    if plan is None:  # staging files that make the whole table, in order
        ranges = writer.write_all(reconciled_dir)
    else:
        guard()
        ranges = place(table_info.name, tdir, version, plan, writer, moved_tag(reconciled_dir))
    if not ranges:
        ranges = [writer.write_empty()]
    writer.sync(ranges)  # on disk before the commit (a local lake)
    manifest = Manifest(
        table=table_info.name,
        version=version,
        files=[r["file"] for r in ranges],
        position=PositionEntry(
            file=position.file,
            pos=position.pos,
            gtid_set=position.gtid_set,
            server_id=position.server_id,
            server_uuid=position.server_uuid,
        ),
        rows=sum(r["rows"] for r in ranges),
        columns=column_entries(table_info.columns),
        chunk_key=list(key),
        published_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        run_id=run_id,
        file_ranges=ranges,
    )
    return _Staged(
        table_info.name,
        tdir,
        manifest,
        attempt(),
        position,
        prepared if committed is None else None,
        current,
    )


def _committed_manifest(
    config: PipelineConfig, run_id: str, table: str, tdir: str, committed: iceberg_commit.RunCommit
) -> Manifest | None:
    """The manifest of the version a run's Iceberg snapshot holds: the one its publish attempt
    wrote before committing (whichever process's attempt won the commit: `write_pending`; an
    attempt of a release before wrote it into the table's ``_tidemark/pending/``), or, for a
    snapshot of a release before attempts, the version's manifest; None when none is there."""
    if committed.version is None:
        return None
    if committed.attempt:
        found = load_pending(pending_file(config, run_id, committed.attempt), table)
        if found is not None and found["version"] == committed.version:
            return found
        uri = pending_uri(tdir, committed.version, committed.attempt)
    else:
        uri = version_uri(tdir, committed.version)
    return load_manifest(uri) if storage.exists(uri) else None
