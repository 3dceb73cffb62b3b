"""`doctor`'s checks of the source's place in a replication topology.

- A replica that does not write what it replicates to its own binlog (MariaDB
  ``Slaves_running`` > 0 with ``log_slave_updates = OFF``) hides every change of its
  primary from a binlog reader: the lake would silently miss them. That fails.
- Every position the state store goes on from (published versions, the unfinished run) must
  be the source's own, or be carried to it by GTID (`orchestrator.binlog.failover`); doctor
  says which, naming the server each was recorded on, and fails for the tables the next run
  will read again.

(GTIDs themselves - MySQL's ``gtid_mode``, MariaDB's ``gtid_strict_mode`` - are settings
in doctor's table.)
"""

from __future__ import annotations

from collections import defaultdict

from orchestrator.binlog.failover import Follower, moved_run
from orchestrator.config import PipelineConfig
from orchestrator.positions import BinlogPosition
from orchestrator.source.check import Check
from orchestrator.source.connection import Source
from orchestrator.state.store import StateStore


def replica_check(source: Source) -> Check:
    """Fails for a server that replicates without writing what it replicates to its binlog."""
    running = dict(
        (str(k), str(v)) for k, v in source.query("SHOW GLOBAL STATUS LIKE 'Slaves_running'")
    )
    updates = source.variables("log_slave_updates")["log_slave_updates"]
    replicating = int(running.get("Slaves_running", "0") or 0)
    if replicating and (updates or "").upper() != "ON":
        return Check(
            "replica binlog",
            False,
            f"{source.address} is a replica (Slaves_running = {replicating}) with "
            "log_slave_updates = OFF: what it replicates is not in its binlog, so Tidemark "
            "would miss its primary's changes",
            "set log_slave_updates = ON in my.cnf and restart the replica, or point the "
            "pipeline at the primary",
        )
    what = (
        f"a replica with log_slave_updates = {updates}" if replicating else "not a running replica"
    )
    return Check("replica binlog", True, f"{source.address} is {what}")


def identity_checks(config: PipelineConfig, source: Source) -> list[Check]:
    """One check per position of the state store that is another server's (a pass when it is
    carried over by GTID, a failure naming the tables that will be read again); one passing
    check when every position is the source's own."""
    follower = Follower(config, source)
    store = StateStore(config.state.url)
    try:
        published: dict[str, list[str]] = defaultdict(list)
        positions: dict[str, BinlogPosition] = {}
        for checkpoint in store.table_checkpoints(config.pipeline):
            position = BinlogPosition.from_json(checkpoint.position)
            positions.setdefault(str(position.to_json()), position)
            published[str(position.to_json())].append(checkpoint.table)
        run = store.unfinished_run(config.pipeline)
        moved = moved_run(follower, store, run) if run is not None else None
    finally:
        store.close()
    checks = []
    for key, tables in sorted(published.items()):
        placed = follower.place(positions[key])
        names = ", ".join(sorted(tables))
        if placed.how == "moved":
            checks.append(Check("server identity", True, f"published {names}: {placed}"))
        elif placed.how == "lost":
            rerun = f"tidemark run --config {config.path}" if config.path else "tidemark run"
            checks.append(
                Check(
                    f"server identity {names}",
                    False,
                    f"published {names}: {placed}: the next run reads them again",
                    f"`{rerun}` reads them again from {source.address}; to go on by GTID, "
                    "point the pipeline at a server whose binlog holds the GTID set",
                )
            )
    if run is not None and moved is not None:
        checks.append(
            Check(
                "server identity",
                True,
                f"the unfinished run {run.run_id}: {moved}; the next run leaves it and starts "
                "anew (what it had not published is read again)",
            )
        )
    if not checks:
        checks.append(
            Check(
                "server identity",
                True,
                "every position the state store goes on from "
                f"is {source.address}'s own ({follower.identity})",
            )
        )
    return checks
