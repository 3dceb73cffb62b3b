"""`doctor`'s check that the binlog the state store still needs is on the server.

A published table goes on from its version's position; an unfinished run's tables go on from the
capture's checkpoint (or from where their reads began). When the file holding that position was
purged, the next run cannot apply the changes since: it reads those tables from the source again
(`orchestrator.pipeline.capture.reread`). `doctor` says so before a run fails on it, naming the
table, the position and the command that gets it back. A position another server recorded says
nothing about this server's files: `orchestrator.binlog.topology` checks those."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import PipelineConfig
from orchestrator.positions import BinlogPosition, ServerIdentity, file_index
from orchestrator.source.check import Check
from orchestrator.state.store import StateStore


@dataclass(frozen=True, slots=True)
class Need:
    """A position some table needs the binlog from, and whose need it is."""

    table: str
    position: BinlogPosition
    who: str  # "published version 3", "run 2026...-ab12"


def needs(store: StateStore, pipeline: str) -> list[Need]:
    """Every position the pipeline's state will read the binlog from."""
    out = [
        Need(cp.table, BinlogPosition.from_json(cp.position), f"published version {cp.version}")
        for cp in store.table_checkpoints(pipeline)
    ]
    run = store.unfinished_run(pipeline)
    if run is None:
        return out
    checkpoint = store.capture_checkpoint(run.run_id)
    for record in store.run_tables(run.run_id):
        if record.status != "planned":
            continue
        start = checkpoint["position"] if checkpoint else record.info.get("from_position")
        if start is None:
            start = run.start_position
        if start:
            out.append(
                Need(
                    record.table,
                    BinlogPosition.from_json(start),
                    f"run {run.run_id} ({run.status})",
                )
            )
    return out


def purged(
    all_needs: list[Need], binlogs: list[str], server: ServerIdentity | None = None
) -> list[Need]:
    """The needs whose binlog file is older than the oldest the server keeps (those recorded on
    another server than ``server`` aside).

    >>> n = Need("d.t", BinlogPosition("b.000001", 4, server_id=1), "published version 1")
    >>> [x.table for x in purged([n], ["b.000002", "b.000003"])], purged([n], ["b.000001"])
    (['d.t'], [])
    >>> purged([n], ["b.000002"], ServerIdentity(2))
    []
    """
    if not binlogs:
        return []
    oldest = min(file_index(name) for name in binlogs)
    return [
        n
        for n in all_needs
        if file_index(n.position.file) < oldest
        and (server is None or server.wrote(n.position) is not False)
    ]


def binlog_kept_checks(
    config: PipelineConfig, binlogs: list[str], server: ServerIdentity
) -> list[Check]:
    """One check per table whose needed binlog is gone (one passing check when none is).

    Args:
        config: the pipeline (its state store is read).
        binlogs: the file names ``SHOW BINARY LOGS`` lists.
        server: the server they are on.
    """
    store = StateStore(config.state.url)
    try:
        gone = purged(needs(store, config.pipeline), binlogs, server)
    finally:
        store.close()
    if not gone:
        return [
            Check(
                "binlog kept",
                True,
                "every position the state store goes on from is still on the server",
            )
        ]
    oldest = min(binlogs, key=file_index)
    rerun = f"tidemark run --config {config.path}" if config.path else "tidemark run"
    return [
        Check(
            f"binlog kept {n.table}",
            False,
            f"{n.who} needs the binlog from {n.position}, but {n.position.file} was purged "
            f"(the oldest kept is {oldest}): the table needs a re-read",
            f"`{rerun}` reads it again from the source (or start it afresh: "
            f"`{rerun} --table {n.table} --snapshot`); keep binlogs longer "
            "(binlog_expire_logs_seconds)",
        )
        for n in gone
    ]
