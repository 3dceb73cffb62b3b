"""`tidemark status` and `tidemark reset`."""

from __future__ import annotations

import logging
import sys

from orchestrator.config import PipelineConfig
from orchestrator.errors import TidemarkError
from orchestrator.lake import iceberg, storage
from orchestrator.lake.manifest import load_manifest
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.positions import BinlogPosition, file_index
from orchestrator.source.connection import Source

log = logging.getLogger(__name__)


def bytes_behind(position: BinlogPosition, binlogs: list[tuple[str, int]]) -> int:
    """How many binlog bytes the server has written after ``position``.

    >>> bytes_behind(BinlogPosition("b.000002", 100), [("b.000001", 500), ("b.000002", 400), ("b.000003", 50)])
    350
    """
    behind = 0
    for name, size in binlogs:
        if file_index(name) == file_index(position.file):
            behind += max(size - position.pos, 0)
        elif file_index(name) > file_index(position.file):
            behind += size
    return behind


def lag_text(position: BinlogPosition, binlogs: list[tuple[str, int]] | None) -> str:
    """How far a published table is behind the source, as `status` prints it.

    >>> lag_text(BinlogPosition("b.000002", 100), [("b.000002", 400)])
    '300 binlog bytes behind'
    >>> lag_text(BinlogPosition("b.000001", 100), [("b.000002", 400)])
    'needs a re-read: binlog b.000001 was purged (the next run snapshots it again)'
    >>> lag_text(BinlogPosition("b.000001", 100), None)
    'lag unknown (source not reachable)'
    """
    if binlogs is None:
        return "lag unknown (source not reachable)"
    if binlogs and position.file not in {name for name, _ in binlogs}:
        return f"needs a re-read: binlog {position.file} was purged (the next run snapshots it again)"
    return f"{bytes_behind(position, binlogs):,} binlog bytes behind"


def status_command(config: PipelineConfig) -> int:
    """Print runs, tables of the latest run, chunk progress, published positions and lag."""
    store = open_store(config)
    try:
        runs = store.runs(config.pipeline, limit=5)
        checkpoints = store.table_checkpoints(config.pipeline)
        out = sys.stdout
        print(f"pipeline {config.pipeline}", file=out)
        if not runs:
            print("  no runs yet", file=out)
        for i, run in enumerate(runs):  # newest first; the latest run's tables under it
            finished = run.finished_at.isoformat(timespec="seconds") if run.finished_at else "-"
            print(f"  run {run.run_id}  {run.status:<9} started {run.created_at.isoformat(timespec='seconds')}"
                  f"  finished {finished}" + (f"  error: {run.error}" if run.error else ""), file=out)
            if i == 0:
                for t in store.status_rows(config.pipeline):  # the latest run's tables, one query
                    detail = (f"chunks {t.chunks_done}/{t.chunks_total}, {t.rows_read:,} rows read"
                              if t.chunks_total else "binlog only")
                    print(f"    {t.table:<32} {t.mode:<11} {t.status:<10} {detail}", file=out)
        lock = store.lock_info(config.pipeline)
        if lock is not None:
            print(f"  locked by {lock.holder} on {lock.hostname} (pid {lock.pid}) since "
                  f"{lock.acquired_at.isoformat(timespec='seconds')}", file=out)
        lag = _binlogs(config) if checkpoints else None
        print("published:", file=out)
        if not checkpoints:
            print("  nothing published yet", file=out)
        for cp in checkpoints:
            position = BinlogPosition.from_json(cp.position)
            behind = lag_text(position, lag)
            print(f"  {cp.table:<32} v{cp.version:<5} {cp.rows:>12,} rows  at {position}  "
                  f"{cp.published_at.isoformat(timespec='seconds')}  {behind}  {_snapshot(cp.manifest)}", file=out)
        return 0
    finally:
        store.close()


def _snapshot(manifest_uri: str) -> str:
    """The Iceberg snapshot id ``current.json`` names, as status prints it."""
    entry = load_manifest(manifest_uri).get("iceberg") if storage.exists(manifest_uri) else None
    return f"iceberg snapshot {entry['snapshot_id']}" if entry else "no iceberg snapshot"


def _binlogs(config: PipelineConfig) -> list[tuple[str, int]] | None:
    """The source's binlog list, or None when the source cannot be reached (status still prints)."""
    try:
        with Source.from_pipeline(config) as source:
            return source.binlogs()
    except TidemarkError as exc:  # no password here, or the source is down
        log.debug("lag unknown: %s", exc)
        return None


def reset_command(config: PipelineConfig, *, tables: list[str], purge_output: bool, unlock: bool,
                  yes: bool) -> int:
    """Show what would be forgotten; with ``yes``, forget it."""
    names = [t.name for t in config.select_tables(tables)] if tables else None
    store = open_store(config)
    try:
        if unlock:
            if yes:
                store.force_unlock(config.pipeline)
                print(f"released the lock of pipeline {config.pipeline}")
            else:
                print(f"would release the lock of pipeline {config.pipeline}; add --yes to do it")
            return 0
        counts = store.forget(config.pipeline, names, dry_run=True)
        scope = ", ".join(names) if names else f"every table of pipeline {config.pipeline}"
        print(f"reset {scope}:")
        for kind, n in counts.items():
            print(f"  {n:>6} {kind}")
        dirs = {t.name: table_dir(config, t.name) for t in config.select_tables(names)}
        if purge_output:
            for name, d in dirs.items():
                print(f"  output {d}{'' if storage.exists(d) else ' (absent)'} and Iceberg table {name}")
        if not yes:
            print("nothing changed; add --yes to do it")
            return 0
        store.forget(config.pipeline, names)
        if purge_output:
            for name, d in dirs.items():
                iceberg.drop_table(config, name)
                storage.delete_tree(d)
        if names is None:
            storage.delete_tree(config.staging_path)
        print("done")
        return 0
    finally:
        store.close()
