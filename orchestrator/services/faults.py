"""Failpoints: deterministic crash injection for the kill/resume tests.

``TIDEMARK_FAILPOINT=name[:n]`` makes the process SIGKILL itself the n-th time
(default 1st) it passes `point(name)`: a crash at an exact step boundary, as a
power cut or an OOM kill would cause. ``name:n:stop`` sends SIGSTOP instead: the
process waits there until a test has broken something (killed the source) and
sends SIGCONT. Unset (always, in production) it costs one dictionary lookup.

Points: ``read.batch_started`` (``L`` recorded, before the reads), ``read.batch_done``,
``capture.checkpoint``, ``capture.flushed`` (segments written, not yet checkpointed),
``reconcile.rewritten`` (a table's files and plan written, not recorded yet; in a reconcile
worker too), ``reconcile.table_done``, ``publish.file_moved`` (after each data file moved into
a table's ``data/``), ``publish.iceberg_committed``, ``publish.files_written``,
``publish.table_done``, ``capture.reading`` (before the binlog is opened), ``decode.job`` (in a
binlog decoding worker, `orchestrator.binlog.pool`, before each job: the worker alone dies).

In a worker process of the run (reconcile's or publish's, `orchestrator.pipeline.workers`),
set up by `forked`, a failpoint acts on the run: a crash kills the run's process first (its other
workers die with it), a stop stops it too, then the worker itself.
"""

from __future__ import annotations

import os
import signal
import threading

_passed: dict[str, int] = {}
#: In a worker process: the run's process, which a failpoint kills or stops first (`forked`).
_run_pid: int | None = None

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
    sig = signal.SIGSTOP if action == "stop" else signal.SIGKILL
    with QUIET:
        if _run_pid is not None:
            os.kill(_run_pid, sig)
        os.kill(os.getpid(), sig)


def forked(run_pid: int) -> None:
    """In a process forked from the run ``run_pid``: failpoints act on the run as well, and `QUIET`
    is a lock of this process's own (another thread of the run may have held it at the fork)."""
    global QUIET, _run_pid
    QUIET = threading.Lock()
    _run_pid = run_pid
