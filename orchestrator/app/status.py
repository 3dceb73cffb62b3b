"""`tidemark status` and `tidemark reset`."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from typing import Any

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
    return _lag(position, binlogs, server)[1]


def _lag(
    position: BinlogPosition,
    binlogs: list[tuple[str, int]] | None,
    server: ServerIdentity | None,
) -> tuple[int | None, str]:
    """`bytes_behind` where the source's binlog holds ``position`` (else None), and `lag_text`."""
    if binlogs is None:
        return None, "lag unknown (source not reachable)"
    if server is not None and server.wrote(position) is False:
        how = (
            f"the next run goes on from GTID set {position.gtid_set} (`tidemark doctor` checks it)"
            if position.gtid_set
            else "no GTID set was recorded: the next run reads it again"
        )
        return None, f"recorded on {position.server}, the source is {server}: {how}"
    if binlogs and position.file not in {name for name, _ in binlogs}:
        return None, (
            f"needs a re-read: binlog {position.file} was purged (the next run snapshots it again)"
        )
    behind = bytes_behind(position, binlogs)
    return behind, f"{behind:,} binlog bytes behind"


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def status_report(config: PipelineConfig) -> dict[str, Any]:
    """What `status` says, as JSON values (``status --json``, docs/cli.md): the patterns' last
    matches, recent runs newest first, the latest run's tables, the pipeline lock, and each
    published table's version, position and lag (``binlog_bytes_behind``: None when the source
    is not reachable, the position is another server's, or its binlog was purged)."""
    store = open_store(config)
    try:
        runs = store.runs(config.pipeline, limit=5)
        checkpoints = store.table_checkpoints(config.pipeline)
        lag, server = _binlogs(config) if checkpoints or runs else (None, None)
        rereads = _unfinished_rereads(store, config, lag, server)
        found = store.table_set(config.pipeline) if config.has_patterns else None
        dropped = set(found.dropped) if found else set()
        report: dict[str, Any] = {
            "pipeline": config.pipeline,
            "source_reachable": lag is not None,
            "patterns": [
                {"summary": str(PatternMatch.from_json(m)), "planned_by_run": found.run_id, **m}
                for m in found.patterns
            ]
            if found
            else [],
            "runs": [
                {
                    "run_id": run.run_id,
                    "status": run.status,
                    "started_at": _when(run.created_at),
                    "finished_at": _when(run.finished_at),
                    "error": run.error,
                }
                for run in runs
            ],
            "latest_run_tables": [],
            "lock": None,
            "published": [],
        }
        if runs:
            failed = {
                r.table: r.info.get("failure", {})
                for r in store.run_tables(runs[0].run_id)
                if r.status == "failed"
            }
            report["latest_run_tables"] = [
                {
                    "table": t.table,
                    "mode": t.mode,
                    "status": t.status,
                    "chunks_done": t.chunks_done,
                    "chunks_total": t.chunks_total,
                    "rows_read": t.rows_read,
                    "failure": failed.get(t.table),
                    "needs_reread": rereads.get(t.table),
                }
                for t in store.status_rows(config.pipeline)  # the latest run's, one query
            ]
        lock = store.lock_info(config.pipeline)
        if lock is not None:
            report["lock"] = {
                "holder": lock.holder,
                "hostname": lock.hostname,
                "pid": lock.pid,
                "acquired_at": _when(lock.acquired_at),
                "refreshed_at": _when(lock.refreshed_at),
                "lease_seconds": lock.lease_seconds,
            }
        for cp in checkpoints:
            position = BinlogPosition.from_json(cp.position)
            behind, text = _lag(position, lag, server)
            manifest = load_manifest(cp.manifest) if storage.exists(cp.manifest) else None
            iceberg = manifest.get("iceberg") if manifest is not None else None
            report["published"].append(
                {
                    "table": cp.table,
                    "version": cp.version,
                    "rows": cp.rows,
                    "position": dict(cp.position),
                    "published_at": _when(cp.published_at),
                    "binlog_bytes_behind": behind,
                    "lag": text,
                    "iceberg_snapshot_id": iceberg["snapshot_id"] if iceberg else None,
                    "note": _checked(manifest, position).strip() or None,
                    "dropped_at_source": cp.table in dropped,
                }
            )
        return report
    finally:
        store.close()


def status_command(config: PipelineConfig, *, as_json: bool = False) -> int:
    """Print runs, tables of the latest run, chunk progress, published positions and lag; with
    ``as_json``, `status_report` as one JSON document."""
    report = status_report(config)
    out = sys.stdout
    if as_json:
        json.dump(report, out, indent=2, default=str)
        print(file=out)
        return 0
    print(f"pipeline {report['pipeline']}", file=out)
    for match in report["patterns"]:
        print(
            f"  pattern {match['summary']} (when run {match['planned_by_run']} was planned)",
            file=out,
        )
    if not report["runs"]:
        print("  no runs yet", file=out)
    for i, run in enumerate(report["runs"]):  # newest first; the latest run's tables under it
        print(
            f"  run {run['run_id']}  {run['status']:<9} started {run['started_at']}"
            f"  finished {run['finished_at'] or '-'}"
            + (f"  error: {run['error']}" if run["error"] else ""),
            file=out,
        )
        for t in report["latest_run_tables"] if i == 0 else []:
            detail = (
                f"chunks {t['chunks_done']}/{t['chunks_total']}, {t['rows_read']:,} rows read"
                if t["chunks_total"]
                else "binlog only"
            )
            if t["failure"] is not None:  # the next run retries it
                detail = f"failed at {t['failure'].get('step')}: {t['failure'].get('reason')}"
            reread = f"  {t['needs_reread']}" if t["needs_reread"] else ""
            print(
                f"    {t['table']:<32} {t['mode']:<11} {t['status']:<10} {detail}{reread}", file=out
            )
    lock = report["lock"]
    if lock is not None:
        print(
            f"  locked by {lock['holder']} on {lock['hostname']} (pid {lock['pid']}) since "
            f"{lock['acquired_at']}, last renewed {lock['refreshed_at']} "
            f"(lease {lock['lease_seconds']} s)",
            file=out,
        )
    print("published:", file=out)
    if not report["published"]:
        print("  nothing published yet", file=out)
    for cp in report["published"]:
        snapshot = cp["iceberg_snapshot_id"]
        print(
            f"  {cp['table']:<32} v{cp['version']:<5} {cp['rows']:>12,} rows  "
            f"at {BinlogPosition.from_json(cp['position'])}  {cp['published_at']}  {cp['lag']}  "
            + (f"iceberg snapshot {snapshot}" if snapshot is not None else "no iceberg snapshot")
            + (f"  {cp['note']}" if cp["note"] else "")
            + (_DROPPED if cp["dropped_at_source"] else ""),
            file=out,
        )
    return 0


_DROPPED = "  dropped at the source: kept as last published"


def _unfinished_rereads(
    store: StateStore,
    config: PipelineConfig,
    binlogs: list[tuple[str, int]] | None,
    server: ServerIdentity | None,
) -> dict[str, str]:
    """The unfinished run's tables whose binlog was purged: ``{table: "needs a re-read..."}``."""
    if not binlogs:
        return {}
    gone = purged(
        [n for n in needs(store, config.pipeline) if n.who.startswith("run ")],
        [name for name, _ in binlogs],
        server,
    )
    return {
        n.table: (
            f"needs a re-read: binlog {n.position.file} was purged (the next run reads it again)"
        )
        for n in gone
    }


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
