"""The pipeline lock of the state store: one active run per pipeline.

``PipelineLockMixin`` holds ``StateStore``'s lock methods; it needs the store's
``url`` and ``_tx``. The lock is a row of ``tm_locks``: a primary-key INSERT
takes a free lock, a compare-and-swap on the row's token takes over a stale one.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.errors import RunLocked, StateError
from orchestrator.state.records import LockRecord, _lock_record
from orchestrator.state.schema import LOCKS, _now

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("tidemark.state")

_LOCK_ATTEMPTS = 5


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _locked_message(lock: LockRecord, config_path: str | None) -> str:
    pid = "pid unknown" if lock.pid is None else f"pid {lock.pid}"
    config = config_path or "<pipeline config>"
    return (f"pipeline {lock.pipeline} is locked by run {lock.holder} on host {lock.hostname} "
            f"({pid}) since {lock.acquired_at.isoformat(timespec='seconds')} (last refreshed "
            f"{lock.refreshed_at.isoformat(timespec='seconds')}); wait for it to finish, or if "
            f"that process is gone run `tidemark reset --config {config} --unlock`")


class PipelineLockMixin:
    """The lock methods of ``StateStore``."""

    if TYPE_CHECKING:
        url: str

        def _tx(self, *, write: bool = True) -> AbstractContextManager[Connection]: ...

    def acquire_lock(self, pipeline: str, holder: str, *, lease_seconds: float = 900,
                     config_path: str | None = None, track_pid: bool = True) -> None:
        """Take the pipeline's lock for ``holder`` (re-entrant for the same holder).

        A re-entrant call refreshes the lock and records the calling process as
        its owner. The lock is taken over, with a warning, when it is stale: its
        host is this host and its pid is gone, or it was not refreshed for
        ``lease_seconds``. Race-free: a primary-key INSERT takes a free lock, a
        compare-and-swap on the lock's token takes over a stale one.

        Args:
            pipeline: the pipeline name.
            holder: who holds it, e.g. an Airflow run id; the same string re-enters.
            lease_seconds: how long an unrefreshed lock stays valid.
            config_path: the config file, named in the "how to unlock" advice.
            track_pid: False records no pid, so the lock outlives this process
                (a lock held across Airflow tasks) and only the lease expires it.

        Raises:
            RunLocked: another holder's lock is live; the message names holder,
                host, pid, since when, and the fix.
        """
        host, pid = socket.gethostname(), (os.getpid() if track_pid else None)
        for _ in range(_LOCK_ATTEMPTS):
            now = _now()
            try:
                with self._tx() as conn:
                    conn.execute(insert(LOCKS).values(
                        pipeline=pipeline, holder=holder, hostname=host, pid=pid,
                        token=uuid.uuid4().hex, acquired_at=now, refreshed_at=now))
                return
            except IntegrityError:
                pass  # someone holds it: look at who
            with self._tx() as conn:
                row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
                if row is None:
                    continue  # released meanwhile: try the INSERT again
                if row.holder == holder:
                    conn.execute(update(LOCKS).where(LOCKS.c.pipeline == pipeline,
                                                     LOCKS.c.token == row.token)
                                 .values(hostname=host, pid=pid, refreshed_at=now))
                    return
                current = _lock_record(row)
                reason = self._stale_reason(current, now, lease_seconds)
                if reason is None:
                    raise RunLocked(_locked_message(current, config_path))
                swapped = conn.execute(
                    update(LOCKS).where(LOCKS.c.pipeline == pipeline, LOCKS.c.token == row.token)
                    .values(holder=holder, hostname=host, pid=pid, token=uuid.uuid4().hex,
                            acquired_at=now, refreshed_at=now))
                if swapped.rowcount == 1:
                    log.warning("took over the stale lock of pipeline %s from run %s on host %s "
                                "(pid %s, since %s): %s", pipeline, current.holder,
                                current.hostname, current.pid, current.acquired_at.isoformat(),
                                reason)
                    return
        raise StateError(f"could not take the lock of pipeline {pipeline}: it changed hands "
                         f"{_LOCK_ATTEMPTS} times while trying; retry")

    @staticmethod
    def _stale_reason(lock: LockRecord, now: datetime, lease_seconds: float) -> str | None:
        if lock.pid is not None and lock.hostname == socket.gethostname() and not _pid_alive(lock.pid):
            return "its process is gone"
        if now - lock.refreshed_at > timedelta(seconds=lease_seconds):
            return f"not refreshed for more than {lease_seconds:g} s"
        return None

    def lock_info(self, pipeline: str) -> LockRecord | None:
        """Who holds the pipeline's lock, or None when it is free."""
        with self._tx(write=False) as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
        return None if row is None else _lock_record(row)

    def release_lock(self, pipeline: str, holder: str) -> None:
        """Drop the lock if ``holder`` has it; a no-op otherwise."""
        with self._tx() as conn:
            conn.execute(delete(LOCKS).where(LOCKS.c.pipeline == pipeline, LOCKS.c.holder == holder))

    def force_unlock(self, pipeline: str) -> None:
        """Drop the pipeline's lock whoever holds it (``tidemark reset --unlock``)."""
        with self._tx() as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
            conn.execute(delete(LOCKS).where(LOCKS.c.pipeline == pipeline))
        if row is not None:
            log.warning("removed the lock of pipeline %s held by run %s on host %s (pid %s)",
                        pipeline, row.holder, row.hostname, row.pid)
