"""Publish, the run's last step: each reconciled table becomes its next version
(`orchestrator.pipeline.publish.versions`, where the order of writes and what a crash leaves are
told), the tables' checkpoints are recorded, the run is finished and the lock released."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, StateError
from orchestrator.lake import storage
from orchestrator.lake.manifest import (
    IcebergEntry,
    Manifest,
    Manifests,
    current_uri,
    find_manifest,
)
from orchestrator.pipeline.capture.xa import XA_FOREIGN, XA_KNOWN
from orchestrator.pipeline.context import (
    current_run,
    open_store,
    position,
    reconciled_dir,
    run_dir,
    table_dir,
    table_info,
)
from orchestrator.pipeline.failed import TablesFailed, fail_table, failures
from orchestrator.pipeline.lines import TableLines
from orchestrator.pipeline.publish import workers as publish_workers
from orchestrator.pipeline.publish.switch import published_at
from orchestrator.pipeline.publish.unchanged import Publishing, kept_version, seen
from orchestrator.pipeline.publish.workers import Switched
from orchestrator.pipeline.reconcile.kept import is_kept
from orchestrator.positions import BinlogPosition
from orchestrator.services import faults
from orchestrator.state.many import RECORD_TABLES
from orchestrator.state.store import RunTableRecord, StateStore, TableCheckpoint

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)

#: What the capture adds to a table's next start about XA transactions, not a position's.
_MARKS = (XA_FOREIGN, XA_KNOWN)


@dataclass(frozen=True, slots=True)
class Published:
    """A table's current version after the run."""

    table: str
    uri: str  # the table's output directory (the Airflow Asset URI)
    version: int
    rows: int
    position: dict[str, Any]
    iceberg: IcebergEntry | None = (
        None  # the version's Iceberg snapshot (None: published before Iceberg)
    )
    #: False when the run found no change: ``version`` is an earlier run's, ``position`` the
    #: position the table was checked up to (the version is the table there too).
    changed: bool = True

    def __str__(self) -> str:
        at = BinlogPosition.from_json(self.position)
        snapshot = f", Iceberg snapshot {self.iceberg['snapshot_id']}" if self.iceberg else ""
        if not self.changed:
            return (
                f"{self.table}: no change, version {self.version} kept ({self.rows} rows), "
                f"checked up to {at}{snapshot}"
            )
        return f"{self.table}: version {self.version}, {self.rows} rows at {at}{snapshot}"


def publish(config: PipelineConfig, run_id: str, *, holder: str) -> list[Published]:
    """Write versions, switch manifests, checkpoint tables, finish the run, release the lock.

    Many tables are published by worker processes, two per core
    (`orchestrator.pipeline.publish.workers`), each opening the Iceberg catalog once; the tables'
    checkpoints are recorded `RECORD_TABLES` at a time in one transaction (a table switched but not
    recorded yet is found published by the rerun, which records it).

    Raises:
        TablesFailed: some tables failed on their own (`orchestrator.pipeline.failed`); the
            others are published and the run is finished ``partial``.
    """
    store = open_store(config)
    try:
        run = current_run(store, config, run_id)
        records = store.run_tables(run_id)
        for record in records:
            if record.status not in ("failed", "reconciled", "published"):
                raise RunFailed(
                    f"table {record.table} is {record.status}, not reconciled; rerun to resume"
                )
        todo = [
            (r, position(r.info.get("captured_to") or run.high_position))
            for r in records
            if r.status == "reconciled"
        ]
        # Tables without a change only have their checkpoints moved: published here, no worker.
        kept: list[tuple[RunTableRecord, BinlogPosition]] = []
        changed: list[tuple[RunTableRecord, BinlogPosition]] = []
        for table in todo:
            (kept if is_kept(reconciled_dir(config, table[0])) else changed).append(table)
        done: list[tuple[TableCheckpoint, bool]] = []
        now: dict[str, Published] = {}  # what this call published: not read back
        highs = {record.table: high for record, high in todo}
        kept_lines = TableLines(log)
        try:
            for group, workers in ((kept, False), (changed, True)):
                for outcome in publish_workers.publish_each(
                    config, run_id, group, _publish_group, store.check_fence, workers=workers
                ):
                    if outcome.checkpoint is None:
                        fail_table(
                            store, run_id, outcome.table, "publish", outcome.reason or "unknown"
                        )
                        continue
                    done.append((outcome.checkpoint, outcome.changed))
                    now[outcome.table] = _published(
                        config,
                        outcome.checkpoint,
                        outcome.iceberg,
                        outcome.changed,
                        at=highs[outcome.table].to_json(),
                    )
                    if not outcome.changed:
                        _kept_line(kept_lines, now[outcome.table])
                    if len(done) >= RECORD_TABLES:
                        done = _record(store, run_id, done)
        except Exception as exc:
            if not isinstance(exc, StateError):  # the tables switched so far are recorded
                _record(store, run_id, done)
            raise
        _record(store, run_id, done)
        kept_lines.flush()
        published = _all_published(config, store, run_id, now)
        failed = failures(store, run_id)
        if failed:
            error = TablesFailed(run_id, failed, config.path, published)
            store.finish_run(run_id, "partial", error=error.summary)
        else:
            store.finish_run(run_id, "succeeded")
        storage.delete_tree(run_dir(config, run_id))
        store.release_lock(config.pipeline, holder)
        if failed:
            raise error
        return published
    finally:
        store.close()


def _publish_group(
    config: PipelineConfig,
    guard: Callable[[], None],
    run_id: str,
    group: Sequence[tuple[RunTableRecord, BinlogPosition]],
    catalog: Catalog | None,
) -> list[Switched | Exception]:
    """Publish reconciled tables, each at its position (`versions.publish_tables`); for each, its
    checkpoint (recorded by the caller) and whether this run published a new version, or the
    exception its publish raised. A table without a change keeps its version
    (`unchanged.kept_version`): a group of such tables imports no pyiceberg."""
    out: list[Switched | Exception | None] = [None] * len(group)
    todo: list[tuple[int, Publishing]] = []
    manifests: list[tuple[int, Manifest | Exception]] = []
    with Manifests(table_dir(config, record.table) for record, _ in group) as current:
        for i, (record, high) in enumerate(group):
            try:  # a record the step cannot read fails that table alone (`table_failure` tells)
                table = Publishing(
                    table_info(record),
                    tuple(record.chunk_key),
                    reconciled_dir(config, record),
                    high,
                )
                # read once (the group's manifests together): versions reuses it
                table = replace(table, seen=seen(config, table, current.find))
                kept = kept_version(config, table, run_id)
            except Exception as exc:
                out[i] = exc
                continue
            if kept is not None:
                manifests.append((i, kept))
            else:
                todo.append((i, table))
    if todo:
        # pyiceberg (and the SQL catalog's SQLAlchemy ORM): imported by a run that commits
        from orchestrator.pipeline.publish.versions import publish_tables

        done = publish_tables(config, [p for _, p in todo], run_id, guard, catalog)
        manifests += zip((i for i, _ in todo), done, strict=True)
    for i, manifest in manifests:
        record, high = group[i]
        try:
            if isinstance(manifest, Exception):
                raise manifest
            faults.point("publish.files_written")
            out[i] = _checkpoint(config, run_id, record, high, manifest)
        except Exception as exc:
            out[i] = exc
    return [
        o if o is not None else RunFailed("internal: a table of the group was not published")
        for o in out
    ]


def _checkpoint(
    config: PipelineConfig,
    run_id: str,
    record: RunTableRecord,
    high: BinlogPosition,
    manifest: Manifest,
) -> Switched:
    """A published table's checkpoint, whether this run published a new version, and its
    Iceberg snapshot.

    A table without changes keeps its version (and the run and time that published it); its
    checkpoint moves on all the same: lag and the next run start from ``high``."""
    changed = manifest["run_id"] == run_id
    checkpoint = TableCheckpoint(
        pipeline=config.pipeline,
        table=record.table,
        version=manifest["version"],
        position=record.info.get("next_from") or high.to_json(),  # held for XA: pipeline.xa
        rows=manifest["rows"],
        manifest=current_uri(table_dir(config, record.table)),
        run_id=manifest["run_id"],
        published_at=dt.datetime.now(dt.UTC) if changed else published_at(manifest),
    )
    if changed:
        new = sum(
            1
            for f in manifest["files"]
            if storage.basename(f).startswith(f"v{manifest['version']:06d}-")
        )
        snapshot = manifest["iceberg"]["snapshot_id"] if "iceberg" in manifest else None
        log.info(
            "table %s: published version %d, %d rows in %d file(s) (%d new) at %s, "
            "Iceberg snapshot %s",
            record.table,
            manifest["version"],
            manifest["rows"],
            len(manifest["files"]),
            new,
            high,
            snapshot,
        )
    return Switched(checkpoint, changed, manifest.get("iceberg"))


def _kept_line(lines: TableLines, published: Published) -> None:
    at = BinlogPosition.from_json(published.position)
    lines.add(
        published.table,
        f"no change: kept version {published.version}, {published.rows} rows at {at}",
        f"no change: versions kept, checked up to {at}",
    )


def _record(
    store: StateStore, run_id: str, done: list[tuple[TableCheckpoint, bool]]
) -> list[tuple[TableCheckpoint, bool]]:
    """Record published tables' checkpoints and status in one transaction; returns an empty list."""
    store.publish_tables(run_id, [c for c, _ in done])
    for _ in done:
        faults.point("publish.table_done")
    return []


def _all_published(
    config: PipelineConfig, store: StateStore, run_id: str, now: Mapping[str, Published]
) -> list[Published]:
    """What each published table of the run's checkpoint says (``changed``: by this run):
    ``now``, the tables this call published, as they are; those an earlier attempt of the run
    published, read back."""
    names = [t for t, _, status in store.run_table_states(run_id) if status == "published"]
    earlier = [t for t in names if t not in now]
    checkpoints = (
        {cp.table: cp for cp in store.table_checkpoints(config.pipeline)} if earlier else {}
    )
    out = []
    for table in names:
        if table in now:
            out.append(now[table])
            continue
        checkpoint = checkpoints.get(table)
        if checkpoint is None:
            raise RunFailed(
                f"internal: table {table} is published but has no checkpoint; rerun to resume"
            )
        found = find_manifest(table_dir(config, table))
        changed = found is not None and found["run_id"] == run_id
        out.append(
            _published(
                config,
                checkpoint,
                found.get("iceberg") if found else None,
                changed,
                at=dict(found["position"]) if found is not None and changed else None,
            )
        )
    return out


def _published(
    config: PipelineConfig,
    checkpoint: TableCheckpoint,
    iceberg: IcebergEntry | None,
    changed: bool,
    *,
    at: dict[str, Any] | None = None,
) -> Published:
    """What ``checkpoint`` says was published, with its version's Iceberg snapshot. ``at``: the
    position the table was published or checked up to (``H``), which the checkpoint's, where the
    next run starts, may lie before (held back for an XA transaction: `pipeline.capture.xa`);
    without it, the checkpoint's, without its mark."""
    return Published(
        table=checkpoint.table,
        uri=table_dir(config, checkpoint.table),
        version=checkpoint.version,
        rows=checkpoint.rows,
        position=at or {k: v for k, v in checkpoint.position.items() if k not in _MARKS},
        iceberg=iceberg,
        changed=changed,
    )
