"""`doctor`'s check of how many connections the source lets its user hold at once.

A user created ``WITH MAX_USER_CONNECTIONS n`` (shared servers, managed databases) is refused
an ``n + 1``-th connection. A run holds up to `OWN_CONNECTIONS` of its own (the source's, the
binlog's two) and one for each Spark read task running at once; over the limit, the reads were
refused ("User ... has exceeded the 'max_user_connections' resource") and every run failed,
reported as a lost connection, each one reading a little further. The session value of
``max_user_connections`` is the account's limit when it has one (else the server's, 0 for
none).
"""

from __future__ import annotations

import os
import re

from orchestrator.config import PipelineConfig
from orchestrator.source.check import Check
from orchestrator.source.connection import Source

#: Connections a run holds beside its Spark read tasks: the source's, and the binlog's control
#: and stream connections (measured: 2 to 3 at the peak of a snapshot's reads).
OWN_CONNECTIONS = 3


def read_tasks(master: str, cores: int | None = None) -> int | None:
    """How many Spark read tasks a local ``master`` runs at once; None for a cluster's (or a
    Spark Connect server's), which the config does not say.

    >>> read_tasks("local[2]"), read_tasks("local[*,4]", cores=8), read_tasks("local")
    (2, 8, 1)
    >>> read_tasks("spark://m:7077") is None
    True
    """
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master.strip())
    if match is None:
        return None
    if match.group(1) == "*":
        return cores if cores is not None else (os.cpu_count() or 1)
    return int(match.group(1) or 1)


def connection_limit_check(config: PipelineConfig, source: Source) -> Check:
    """PASS when the user may hold as many connections as a run of this process takes; FAIL
    naming the limit, what a run holds and both fixes otherwise."""
    limit = int(source.query("SELECT @@session.max_user_connections")[0][0] or 0)
    name = "connection limit"
    if limit == 0:
        return Check(name, True, "no limit on the user's connections at once")
    user = config.source.user
    tasks = None if config.spark.remote else read_tasks(config.spark.master)
    if tasks is None:
        return Check(
            name,
            True,
            f"user `{user}` may hold {limit} connections at once: keep the cluster's Spark read "
            f"tasks at once below {max(limit - OWN_CONNECTIONS, 1)} (a run holds up to "
            f"{OWN_CONNECTIONS} of its own)",
        )
    needed = tasks + OWN_CONNECTIONS
    detail = (
        f"user `{user}` may hold {limit} connections at once (MAX_USER_CONNECTIONS); a run holds "
        f"up to {needed}: {tasks} Spark read task(s) ({config.spark.master}) and "
        f"{OWN_CONNECTIONS} of its own"
    )
    if needed <= limit:
        return Check(name, True, detail)
    fewer = limit - OWN_CONNECTIONS
    return Check(
        name,
        False,
        detail,
        f"raise it (ALTER USER `{user}` WITH MAX_USER_CONNECTIONS {needed})"
        + (f", or read with fewer tasks (spark.master: local[{fewer}])" if fewer >= 1 else ""),
    )
