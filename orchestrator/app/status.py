"""`tidemark status` and `tidemark reset`."""

from __future__ import annotations

import logging
import sys

from orchestrator.config import PipelineConfig
from orchestrator.config.patterns import PatternMatch, resolve, takes
from orchestrator.errors import TidemarkError
from orchestrator.lake import storage
from orchestrator.lake.manifest import Manifest, load_manifest
from orchestrator.pipeline.context import open_store, table_dir
from orchestrator.positions import BinlogPosition, ServerIdentity, file_index
from orchestrator.source.connection import Source
from orchestrator.source.kept import needs, purged
from orchestrator.state.store import StateStore

log = logging.getLogger(__name__)


def bytes_behind(position: BinlogPosition, binlogs: list[tuple[str, int]]) -> int:
    """How many binlog bytes the server has written after ``position``.

    >>> bytes_behind(BinlogPosition("b.000002", 100),
    ...              [("b.000001", 500), ("b.000002", 400), ("b.000003", 50)])
    350
    """
    behind = 0
    for name, size in binlogs:
        if file_index(name) == file_index(position.file):
            behind += max(size - position.pos, 0)
        elif file_index(name) > file_index(position.file):
            behind += size
    return behind


def lag_text(
    position: BinlogPosition,
    binlogs: list[tuple[str, int]] | None,
    server: ServerIdentity | None = None,
) -> str:
    """How far a published table is behind the source, as `status` prints it; a position
    another server recorded has no lag here (its offsets are not the source's).

    >>> lag_text(BinlogPosition("b.000002", 100), [("b.000002", 400)])
    '300 binlog bytes behind'
    >>> lag_text(BinlogPosition("b.000001", 100), [("b.000002", 400)])
    'needs a re-read: binlog b.000001 was purged (the next run snapshots it again)'
    >>> lag_text(BinlogPosition("b.000001", 100), None)
    'lag unknown (source not reachable)'
    >>> p = BinlogPosition("b.000001", 100, server_id=2, gtid_set="0-2-5")
    >>> lag_text(p, [], ServerIdentity(1)) == (
    ...     "recorded on server_id 2, the source is server_id 1: the next run goes on from GTID set"
    ...     " 0-2-5 (`tidemark doctor` checks it)")
    True
    """
    if binlogs is None:
        return "lag unknown (source not reachable)"
    if server is not None and server.wrote(position) is False:
        how = (
            f"the next run goes on from GTID set {position.gtid_set} (`tidemark doctor` checks it)"
            if position.gtid_set
            else "no GTID set was recorded: the next run reads it again"
        )
        return f"recorded on {position.server}, the source is {server}: {how}"
    if binlogs and position.file not in {name for name, _ in binlogs}:
        return (
            f"needs a re-read: binlog {position.file} was purged (the next run snapshots it again)"
        )
    return f"{bytes_behind(position, binlogs):,} binlog bytes behind"


def status_command(config: PipelineConfig) -> int:
    """Print runs, tables of the latest run, chunk progress, published positions and lag."""
    store = open_store(config)
    try:
        runs = store.runs(config.pipeline, limit=5)
        checkpoints = store.table_checkpoints(config.pipeline)
        out = sys.stdout
        lag, server = _binlogs(config) if checkpoints or runs else (None, None)
        rereads = _unfinished_rereads(store, config, lag, server)
        print(f"pipeline {config.pipeline}", file=out)
        found = store.table_set(config.pipeline) if config.has_patterns else None
        dropped = set(found.dropped) if found else set()
        if found is not None:
            for match in found.patterns:
                print(
                    f"  pattern {PatternMatch.from_json(match)} "
                    f"(when run {found.run_id} was planned)",
                    file=out,
                )
        if not runs:
            print("  no runs yet", file=out)
        for i, run in enumerate(runs):  # newest first; the latest run's tables under it
            finished = run.finished_at.isoformat(timespec="seconds") if run.finished_at else "-"
            print(
                f"  run {run.run_id}  {run.status:<9} "
                f"started {run.created_at.isoformat(timespec='seconds')}"
                f"  finished {finished}" + (f"  error: {run.error}" if run.error else ""),
                file=out,
            )
            if i == 0:
                failed = {
                    r.table: r.info.get("failure", {})
                    for r in store.run_tables(run.run_id)
                    if r.status == "failed"
                }
                for t in store.status_rows(config.pipeline):  # the latest run's tables, one query
                    detail = (
                        f"chunks {t.chunks_done}/{t.chunks_total}, {t.rows_read:,} rows read"
                        if t.chunks_total
                        else "binlog only"
                    )
                    if t.table in failed:  # the next run retries it
                        detail = (
                            f"failed at {failed[t.table].get('step')}: "
                            f"{failed[t.table].get('reason')}"
                        )
                    print(
                        f"    {t.table:<32} {t.mode:<11} {t.status:<10} "
                        f"{detail}{rereads.get(t.table, '')}",
                        file=out,
                    )
        lock = store.lock_info(config.pipeline)
        if lock is not None:
            print(
                f"  locked by {lock.holder} on {lock.hostname} (pid {lock.pid}) since "
                f"{lock.acquired_at.isoformat(timespec='seconds')}, last renewed "
                f"{lock.refreshed_at.isoformat(timespec='seconds')} (lease {lock.lease_seconds} s)",
                file=out,
            )
        print("published:", file=out)
        if not checkpoints:
            print("  nothing published yet", file=out)
        for cp in checkpoints:
            position = BinlogPosition.from_json(cp.position)
            behind = lag_text(position, lag, server)
            manifest = load_manifest(cp.manifest) if storage.exists(cp.manifest) else None
            print(
                f"  {cp.table:<32} v{cp.version:<5} {cp.rows:>12,} rows  at {position}  "
                f"{cp.published_at.isoformat(timespec='seconds')}  {behind}  {_snapshot(manifest)}"
                f"{_checked(manifest, position)}{_DROPPED if cp.table in dropped else ''}",
                file=out,
            )
        return 0
    finally:
        store.close()


_DROPPED = "  dropped at the source: kept as last published"


def _unfinished_rereads(
    store: StateStore,
    config: PipelineConfig,
    binlogs: list[tuple[str, int]] | None,
    server: ServerIdentity | None,
) -> dict[str, str]:
    """The unfinished run's tables whose binlog was purged: ``{table: "  needs a re-read..."}``."""
    if not binlogs:
        return {}
    gone = purged(
        [n for n in needs(store, config.pipeline) if n.who.startswith("run ")],
        [name for name, _ in binlogs],
        server,
    )
    return {
        n.table: f"  needs a re-read: binlog {n.position.file} was purged "
        "(the next run reads it again)"
        for n in gone
    }


def _snapshot(manifest: Manifest | None) -> str:
    """The Iceberg snapshot id ``current.json`` names, as status prints it."""
    entry = manifest.get("iceberg") if manifest is not None else None
    return f"iceberg snapshot {entry['snapshot_id']}" if entry else "no iceberg snapshot"


def _checked(manifest: Manifest | None, position: BinlogPosition) -> str:
    """What status adds when runs since the version found no change: the version's own position
    (``current.json``'s, its Iceberg snapshot's) is older than the position checked up to.

    >>> m = {"version": 3, "position": {"file": "b.000001", "pos": 4, "gtid_set": None}}
    >>> _checked(m, BinlogPosition("b.000002", 9))  # type: ignore[arg-type]
    '  (version 3 is at b.000001:4; no change since)'
    >>> _checked(m, BinlogPosition("b.000001", 4))  # type: ignore[arg-type]
    ''
    >>> print(_checked(m, BinlogPosition("b.000001", 2)))  # type: ignore[arg-type]
    ... # doctest: +NORMALIZE_WHITESPACE
      (version 3 is at b.000001:4; the next run reads from b.000001:2, where an XA transaction
      not committed then began)
    """
    if manifest is None:
        return ""
    at = BinlogPosition.from_json(dict(manifest["position"]))
    if (at.file, at.pos) == (position.file, position.pos):
        return ""
    if at.key > position.key:  # held back (`orchestrator.pipeline.capture.xa`)
        return (
            f"  (version {manifest['version']} is at {at}; the next run reads from {position}, "
            "where an XA transaction not committed then began)"
        )
    return f"  (version {manifest['version']} is at {at}; no change since)"


def _binlogs(config: PipelineConfig) -> tuple[list[tuple[str, int]] | None, ServerIdentity | None]:
    """The source's binlog list and identity, or Nones when the source cannot be reached
    (status still prints)."""
    try:
        with Source.from_pipeline(config) as source:
            return source.binlogs(), source.identity()
    except TidemarkError as exc:  # no password here, or the source is down
        log.debug("lag unknown: %s", exc)
        return None, None


def _reset_tables(config: PipelineConfig, store: StateStore, names: list[str] | None) -> list[str]:
    """The tables ``reset`` names: configured tables, or what a pattern entry takes among the tables
    the state store knows (published, or in the latest run); all of those when none are named.
    No source is asked: reset works while it is down."""
    known = set(store.published_versions(config.pipeline))
    for run in store.runs(config.pipeline, limit=1):
        known |= set(run.options.get("tables", []))
    if not config.has_patterns:
        if not names:
            return [t.name for t in config.tables]
        # a table removed from the config that the store still knows can be forgotten too
        removed = [n for n in names if n in known and resolve(config.tables, n) is None]
        rest = [n for n in names if n not in removed]
        return removed + ([t.name for t in config.select_tables(rest)] if rest else [])
    known |= {t.name for t in config.tables if not t.pattern}
    taken = sorted(n for n in known if resolve(config.tables, n) is not None)
    if not names:
        return taken
    chosen: list[str] = []
    for name in names:
        entry = next((t for t in config.tables if t.pattern and t.name == name), None)
        if entry is not None:
            chosen += [
                n for n in taken if resolve(config.tables, n) is not None and takes(entry, n)
            ]
        else:
            chosen.append(config.table(name).name)
    return list(dict.fromkeys(chosen))


def reset_command(
    config: PipelineConfig, *, tables: list[str], purge_output: bool, unlock: bool, yes: bool
) -> int:
    """Show what would be forgotten; with ``yes``, forget it."""
    store = open_store(config)
    try:
        names = _reset_tables(config, store, tables) if tables else None
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
        dirs = {
            name: table_dir(config, name) for name in names or _reset_tables(config, store, None)
        }
        if purge_output:
            for name, d in dirs.items():
                print(
                    f"  output {d}{'' if storage.exists(d) else ' (absent)'} "
                    f"and Iceberg table {name}"
                )
        if not yes:
            print("nothing changed; add --yes to do it")
            return 0
        store.forget(config.pipeline, names)
        if purge_output:
            for name, d in dirs.items():
                from orchestrator.lake import iceberg  # pyiceberg: for `reset --purge-output`

                iceberg.drop_table(config, name, d)
                storage.delete_tree(d)
        if names is None:
            storage.delete_tree(config.staging_path)
        print("done")
        return 0
    finally:
        store.close()
