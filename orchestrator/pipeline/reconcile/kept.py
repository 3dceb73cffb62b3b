"""Reconcile of incremental tables that received no change: their plans, many to a file.

An incremental table without a durable change segment in the run has no slot to rewrite: its version
plan (`orchestrator.lake.layout.VersionPlan`) lists every file of the current version, shared,
exactly what `orchestrator.pipeline.reconcile.rewrite.rewrite` plans for it, and publish then keeps
the version (`orchestrator.pipeline.publish.versions`, ``_unchanged``). Such plans are written
`RECORD_TABLES` at a time to one file (`layout.write_plans`) in a directory unique to the batch,
before the tables are recorded reconciled; each table's reconciled dir is ``<that
directory>/<table>``, never created, which `layout.read_plan` resolves to its plan in the file. So a
run of thousands of tables without a change writes and fsyncs one file per batch, not a directory
and a file per table, and the run's staging holds a few files to delete at its end. A crash before
the batch is recorded leaves a file nothing names (the rerun reconciles those tables again under a
new tag).

Snapshot tables whose chunks received no change are batched the same way (`SNAPSHOTS`): their
plan lists the chunk files, each to be moved in as a file of the first version, and nothing is
written for them but that line of the batch's file (a first run of thousands of small tables
fsynced a plan file per table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed
from orchestrator.lake import layout, storage
from orchestrator.lake.layout import VersionPlan
from orchestrator.lake.manifest import Manifest, find_manifest, read_manifest
from orchestrator.pipeline.changes import key_names
from orchestrator.pipeline.context import run_dir, table_dir, table_info
from orchestrator.state.store import RunTableRecord, StateStore


def unchanged_plan(
    config: PipelineConfig,
    record: RunTableRecord,
    find: Callable[[str], Manifest | None] = find_manifest,
) -> VersionPlan | None:
    """The plan of an incremental table without changes: its current version's non-empty files,
    shared, in key order; None when the version has no file ranges to trust (the general path
    rewrites such a table whole, once). ``find`` reads the current manifest (`Manifests.find`:
    read with the other tables')."""
    if record.chunk_key:  # a key the table lacks fails as in the general path
        key_names(table_info(record), record.chunk_key)
    manifest = read_manifest(table_dir(config, record.table), find)
    planned_base(record.table, manifest, record.info.get("base_version"))
    ranges = layout.usable_ranges(manifest["files"], manifest.get("file_ranges"))
    if ranges is None:
        return None
    return VersionPlan(
        manifest["version"], (), tuple(layout.planned(r, r["file"], True) for r in ranges)
    )


def planned_base(table: str, manifest: Mapping[str, Any], planned: int | None) -> None:
    """Raise when the current version is not the one the run planned the table on (``planned``;
    None: planned by an earlier release): an older ``current.json`` put back since (by a stale
    writer, or restored by hand) would have this run's changes applied to the wrong rows. The
    table fails alone; the next run plans it again from its recorded checkpoint."""
    if planned is not None and manifest["version"] != planned:
        raise RunFailed(
            f"table {table}: version {manifest['version']} is current, but the run planned "
            f"it on version {planned} (current.json was replaced since); the next run plans "
            "it again"
        )


_KEPT = "_kept-"
#: The batches of snapshot tables that received no change (their chunk files are the version).
SNAPSHOTS = "_plans-"


def _batch_dir(config: PipelineConfig, run_id: str, prefix: str) -> str:
    return run_dir(config, run_id, "reconciled", f"{prefix}{storage.attempt_tag()}")


def is_kept(reconciled_dir: str) -> bool:
    """Whether ``reconciled_dir`` names a table's plan in a batch of tables without a change.

    >>> (is_kept("/s/run/reconciled/_kept-1a2b3c4d/shop.orders"),
    ...  is_kept("/s/run/reconciled/shop.orders-1a2b3c4d"))
    (True, False)
    """
    return storage.basename(storage.parent(reconciled_dir)).startswith(_KEPT)


@dataclass
class KeptPlans:
    """Plans of tables without a change, waiting to be written as one file."""

    config: PipelineConfig
    run_id: str
    #: `_KEPT` for incremental tables without a change (`is_kept`: publish keeps their versions),
    #: `SNAPSHOTS` for snapshot tables without a change (published as new versions).
    prefix: str = _KEPT
    directory: str = ""  # unique to the batch: its file is written once, whole
    plans: dict[str, VersionPlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = self.directory or _batch_dir(self.config, self.run_id, self.prefix)

    def dir_of(self, table: str) -> str:
        """The reconciled dir that names ``table``'s plan in this batch (once written)."""
        return storage.join(self.directory, table)

    def add(self, table: str, plan: VersionPlan) -> str:
        """Take ``table``'s plan; returns the reconciled dir that names it (once written)."""
        self.plans[table] = plan
        return self.dir_of(table)

    def write(self, store: StateStore) -> None:
        """Write the batch's plans (before the tables are recorded) and start a new batch."""
        if not self.plans:
            return
        store.check_fence()  # a process that lost the pipeline lock writes nothing more
        layout.write_plans(self.directory, self.plans)
        self.directory, self.plans = _batch_dir(self.config, self.run_id, self.prefix), {}
