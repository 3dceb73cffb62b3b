"""Failpoints: deterministic crash injection for the kill/resume tests.

``TIDEMARK_FAILPOINT=name[:n]`` makes the process SIGKILL itself the n-th time
(default 1st) it passes `point(name)`: a crash at an exact step boundary, as a
power cut or an OOM kill would cause. ``name:n:stop`` sends SIGSTOP instead: the
process waits there until a test has broken something (killed the source) and
sends SIGCONT. Unset (always, in production) it costs one dictionary lookup.

Points: ``read.batch_done``, ``capture.checkpoint``, ``capture.flushed`` (segments
written, not yet checkpointed), ``reconcile.table_done``, ``publish.file_moved`` (after each
data file moved into a table's ``data/``), ``publish.iceberg_committed``,
``publish.files_written``, ``publish.table_done``, ``capture.reading`` (before the binlog
is opened).
"""

from __future__ import annotations

import os
import signal
import threading

_passed: dict[str, int] = {}

#: Held while a failpoint stops the process, and by the lease's heartbeat around its renewal
#: (`orchestrator.state.lease`): a test's pause never leaves a state-store transaction open.
QUIET = threading.Lock()


def point(name: str) -> None:
    spec = os.environ.get("TIDEMARK_FAILPOINT")
    if not spec:
        return
    target, _, rest = spec.partition(":")
    if target != name:
        return
    count, _, action = rest.partition(":")
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] != int(count or 1):  # the n-th pass only (a retried step passes again)
        return
    if action == "stop":
        with QUIET:
            os.kill(os.getpid(), signal.SIGSTOP)
    else:
        os.kill(os.getpid(), signal.SIGKILL)
