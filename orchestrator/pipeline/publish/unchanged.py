"""A reconciled table without a change keeps its current version: no new version, no Iceberg
snapshot, no catalog opened, and so no pyiceberg imported (`orchestrator.pipeline.publish.step`
asks here first; `orchestrator.pipeline.publish.versions` publishes the others).

The current version is the table at the run's position as well when the run rewrote no file of
it and its columns and key are as published: no change of the table lies between. A new version
would only copy its file list and add an Iceberg snapshot of the same files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.config import PipelineConfig
from orchestrator.errors import RunFailed, resnapshot_hint
from orchestrator.lake import layout
from orchestrator.lake.manifest import Manifest, column_entries, find_manifest
from orchestrator.pipeline.context import table_dir
from orchestrator.pipeline.reconcile.kept import is_kept
from orchestrator.positions import BinlogPosition
from orchestrator.schema.tables import TableInfo

log = logging.getLogger("orchestrator.pipeline.publish.versions")  # its lines keep their name


@dataclass(frozen=True, slots=True)
class Seen:
    """What a table's publish reads first (`seen`): its current manifest (None: no version yet)
    and the plan its reconcile wrote (None: staging files that make the whole table)."""

    current: Manifest | None
    plan: layout.VersionPlan | None


@dataclass(frozen=True, slots=True)
class Publishing:
    """A reconciled table to publish (`versions.publish_table`'s arguments of one table), with what
    was read of it already (``seen``; None: nothing yet)."""

    table_info: TableInfo
    key: tuple[str, ...]
    reconciled_dir: str
    position: BinlogPosition
    seen: Seen | None = None


def seen(
    config: PipelineConfig,
    table: Publishing,
    find: Callable[[str], Manifest | None] = find_manifest,
) -> Seen:
    """``table``'s current manifest and plan: as read before (``table.seen``), or read now (the
    manifest by ``find``: `Manifests.find`, read with the group's). The publish step reads them
    once a table (`kept_version` first, then `versions.publish_tables`): on an object store each
    read is two requests."""
    if table.seen is not None:
        return table.seen
    return Seen(
        find(table_dir(config, table.table_info.name)),
        layout.read_plan(table.reconciled_dir, shared_only=is_kept(table.reconciled_dir)),
    )


def kept_version(config: PipelineConfig, table: Publishing, run_id: str) -> Manifest | None:
    """``table``'s current manifest when the run changed nothing of it (the caller records the
    position checked), else None: the table has a version to write, or this run published one.

    Args:
        config: the pipeline.
        table: the reconciled table (what `seen` gives of it).
        run_id: the run publishing it.

    Raises:
        RunFailed: the rewrite applies to another version than the current one, or the current
            version predates Iceberg (both name the fix).
    """
    found = seen(config, table)
    current, plan = found.current, found.plan
    if (
        plan is None
        or plan.base_version is None
        or plan.slots
        or current is None
        or current["run_id"] == run_id
    ):
        return None
    current = check_base(table.table_info.name, current, plan)
    if not unchanged(current, plan, table.table_info, table.key):
        return None
    log.debug(  # publish's line says it at INFO, with the tables that share it
        "table %s: no change since version %d; no new version, no Iceberg snapshot "
        "(the state store records %s as checked)",
        table.table_info.name,
        current["version"],
        table.position,
    )
    return current


def check_base(table: str, current: Manifest | None, plan: layout.VersionPlan) -> Manifest:
    """The current version an incremental reconcile's rewrite applies to; a RunFailed naming the fix
    when it is not the version the reconcile read, or predates Iceberg."""
    if current is not None and "iceberg" not in current:
        raise RunFailed(
            f"table {table}: version {current['version']} was published before "
            "Tidemark wrote Iceberg tables; " + resnapshot_hint(table)
        )
    if current is None or current["version"] != plan.base_version:
        raise RunFailed(
            f"table {table}: the run reconciled against version {plan.base_version} "
            f"but version {current['version'] if current else 'none'} is current; "
            + resnapshot_hint(table)
        )
    return current


def check_not_newer(table: str, current: Manifest | None, position: BinlogPosition) -> None:
    """A RunFailed when the current version is the source at a later position than ``position``
    (this run's, on the same server). A pipeline's versions of a table follow each other in
    binlog order, its runs one at a time; a later one in the lake was published by another
    writer meanwhile (another pipeline given the same table and lake). Publishing over it would
    take the table back in time, and that writer's next run would apply its changes from its own
    later position to this older version."""
    if current is None:
        return
    theirs = BinlogPosition.from_json(dict(current["position"]))
    if position.before(theirs) is not True:
        return
    raise RunFailed(
        f"table {table}: version {current['version']} in the lake, of run {current['run_id']}, "
        f"is the table at {theirs}, later than this run's {position}: another writer published "
        "it meanwhile (is another pipeline writing this table? Each table belongs in one "
        "pipeline's output: take it out of the other pipeline's tables, or give the pipelines "
        "different output paths); this run's version would take the table back. "
        + resnapshot_hint(table)
    )


def unchanged(
    current: Manifest, plan: layout.VersionPlan, table_info: TableInfo, key: Sequence[str]
) -> bool:
    """Whether an incremental run found nothing to change: no slot rewritten, same columns and key
    (the module docstring says why such a run publishes no version)."""
    return (
        not plan.slots
        and current["columns"] == column_entries(table_info.columns)
        and list(current["chunk_key"]) == list(key)
    )
