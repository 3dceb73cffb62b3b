"""The pipeline lock of the state store: one active run per pipeline, and its fence.

``PipelineLockMixin`` holds ``StateStore``'s lock methods; it needs the store's
``url`` and ``_tx``. The lock is a row of ``tm_locks``: a primary-key INSERT
takes a free lock, a compare-and-swap on the row's token takes over a stale one.

The token is the fence. Taking the lock returns a `Fence` (pipeline, holder, token,
lease); a store bound to it (``StateStore(url, guard=...)``) checks in every writing
transaction, first, that the lock row still carries that token (`confirm_fence`), and
the transaction fails with `LockLost` when it does not: a process whose lock was taken
over cannot record anything, whatever it does next. The same statement renews the lease,
as the heartbeat (`orchestrator.state.lease`) does between writes.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.errors import LockLost, RunLocked, StateError
from orchestrator.state.records import LockRecord, _lock_record
from orchestrator.state.schema import LOCKS, _now

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("tidemark.state")

_LOCK_ATTEMPTS = 5
#: The lease a holder declares unless told otherwise (``state.lock_lease_seconds``).
DEFAULT_LEASE_SECONDS = 900


@dataclass(frozen=True, slots=True)
class Fence:
    """The pipeline lock as one holder took it: the token changes on every takeover."""

    pipeline: str
    holder: str
    token: str
    lease_seconds: int

    def __str__(self) -> str:
        return f"the lock of pipeline {self.pipeline}, held as run {self.holder}"

    @property
    def fence(self) -> Fence:
        """`Guard`: the fence is itself."""
        return self

    def confirm(self, conn: Connection) -> None:
        """`Guard`: check the fence inside ``conn``'s writing transaction."""
        confirm_fence(conn, self)

    def check(self) -> None:
        """`Guard`: nothing to check outside a transaction without a heartbeat."""

    def released(self) -> None:
        """`Guard`: nothing to remember."""


class Guard(Protocol):
    """What a fenced store asks before it writes (`Fence`, or a `Lease` with its heartbeat)."""

    fence: Fence

    def confirm(self, conn: Connection) -> None:
        """Raise `LockLost` unless the lock is still this fence's, inside ``conn``'s transaction."""

    def check(self) -> None:
        """Raise `LockLost` if the lock may be lost; before a file is written or deleted."""

    def released(self) -> None:
        """The holder released the lock itself: not a loss."""


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
    return (
        f"pipeline {lock.pipeline} is locked by run {lock.holder} on host {lock.hostname} "
        f"({pid}) since {lock.acquired_at.isoformat(timespec='seconds')} (last renewed "
        f"{lock.refreshed_at.isoformat(timespec='seconds')}, lease {lock.lease_seconds} s); "
        f"wait for it to finish, or if that process is gone run "
        f"`tidemark reset --config {config} --unlock --yes`"
    )


def lost_message(fence: Fence, now_held: LockRecord | None) -> str:
    """The one line of a process that lost its lock: who has it now, and that it stops."""
    if now_held is None:
        who = "the lock was released (`tidemark reset --unlock`, or the run ended elsewhere)"
    else:
        pid = "" if now_held.pid is None else f", pid {now_held.pid}"
        who = (
            f"run {now_held.holder} (host {now_held.hostname}{pid}) took it over at "
            f"{now_held.acquired_at.isoformat(timespec='seconds')} and continues the run"
        )
    return (
        f"lost the lock of pipeline {fence.pipeline}: this process held it as run "
        f"{fence.holder} and was not heard from within its {fence.lease_seconds} s lease "
        f"(state.lock_lease_seconds); {who}; this process stops without writing anything more"
    )


def confirm_fence(conn: Connection, fence: Fence) -> None:
    """Renew ``fence``'s lease inside ``conn``'s transaction, or raise `LockLost`.

    The UPDATE holds the lock row (SQLite: the database) until the transaction ends, so
    a takeover cannot slip between this check and the writes after it."""
    renewed = conn.execute(
        update(LOCKS)
        .where(LOCKS.c.pipeline == fence.pipeline, LOCKS.c.token == fence.token)
        .values(refreshed_at=_now())
    )
    if renewed.rowcount == 1:
        return
    row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == fence.pipeline)).first()
    raise LockLost(lost_message(fence, None if row is None else _lock_record(row)))


class PipelineLockMixin:
    """The lock methods of ``StateStore`` (never fenced: they are what the fence is made of)."""

    if TYPE_CHECKING:
        url: str

        def _tx(
            self, *, write: bool = True, fenced: bool = True
        ) -> AbstractContextManager[Connection]: ...

    def acquire_lock(
        self,
        pipeline: str,
        holder: str,
        *,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        config_path: str | None = None,
        track_pid: bool = True,
    ) -> Fence:
        """Take the pipeline's lock for ``holder`` (re-entrant for the same holder).

        A re-entrant call renews the lock, keeps its token and records the calling process
        as its owner. The lock is taken over, with a warning, when it is stale: its host is
        this host and its pid is gone, or it was not renewed within the lease its holder
        declared. Race-free: a primary-key INSERT takes a free lock, a compare-and-swap on
        the lock's token takes over a stale one.

        Args:
            pipeline: the pipeline name.
            holder: who holds it, e.g. an Airflow run id; the same string re-enters.
            lease_seconds: how long the lock stays valid without a renewal (recorded: a
                taker judges the lock by its holder's lease).
            config_path: the config file, named in the "how to unlock" advice.
            track_pid: False records no pid, so the lock outlives this process
                (a lock held across Airflow tasks) and only the lease expires it.

        Returns:
            The fence of the lock as held now.

        Raises:
            RunLocked: another holder's lock is live; the message names holder,
                host, pid, since when, its last renewal, and the fix.
        """
        host, pid = socket.gethostname(), (os.getpid() if track_pid else None)
        for _ in range(_LOCK_ATTEMPTS):
            now, token = _now(), uuid.uuid4().hex
            try:
                with self._tx(fenced=False) as conn:
                    conn.execute(
                        insert(LOCKS).values(
                            pipeline=pipeline,
                            holder=holder,
                            hostname=host,
                            pid=pid,
                            token=token,
                            acquired_at=now,
                            refreshed_at=now,
                            lease_seconds=lease_seconds,
                        )
                    )
                return Fence(pipeline, holder, token, lease_seconds)
            except IntegrityError:
                pass  # someone holds it: look at who
            with self._tx(fenced=False) as conn:
                row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
                if row is None:
                    continue  # released meanwhile: try the INSERT again
                if row.holder == holder:
                    conn.execute(
                        update(LOCKS)
                        .where(LOCKS.c.pipeline == pipeline, LOCKS.c.token == row.token)
                        .values(
                            hostname=host, pid=pid, refreshed_at=now, lease_seconds=lease_seconds
                        )
                    )
                    return Fence(pipeline, holder, row.token, lease_seconds)
                current = _lock_record(row)
                reason = self._stale_reason(current, now)
                if reason is None:
                    raise RunLocked(_locked_message(current, config_path))
                swapped = conn.execute(
                    update(LOCKS)
                    .where(LOCKS.c.pipeline == pipeline, LOCKS.c.token == row.token)
                    .values(
                        holder=holder,
                        hostname=host,
                        pid=pid,
                        token=token,
                        acquired_at=now,
                        refreshed_at=now,
                        lease_seconds=lease_seconds,
                    )
                )
                if swapped.rowcount == 1:
                    log.warning(
                        "took over the stale lock of pipeline %s from run %s on host %s "
                        "(pid %s, since %s): %s",
                        pipeline,
                        current.holder,
                        current.hostname,
                        current.pid,
                        current.acquired_at.isoformat(),
                        reason,
                    )
                    return Fence(pipeline, holder, token, lease_seconds)
        raise StateError(
            f"could not take the lock of pipeline {pipeline}: it changed hands "
            f"{_LOCK_ATTEMPTS} times while trying; retry"
        )

    @staticmethod
    def _stale_reason(lock: LockRecord, now: datetime) -> str | None:
        if (
            lock.pid is not None
            and lock.hostname == socket.gethostname()
            and not _pid_alive(lock.pid)
        ):
            return "its process is gone"
        if now - lock.refreshed_at > timedelta(seconds=lock.lease_seconds):
            return f"not renewed within its lease of {lock.lease_seconds} s"
        return None

    def renew_lock(self, fence: Fence) -> None:
        """Renew the lease of ``fence`` (a heartbeat).

        Raises:
            LockLost: the lock is no longer this fence's.
        """
        with self._tx(fenced=False) as conn:
            confirm_fence(conn, fence)

    def lock_info(self, pipeline: str) -> LockRecord | None:
        """Who holds the pipeline's lock, or None when it is free."""
        with self._tx(write=False) as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
        return None if row is None else _lock_record(row)

    def release_lock(self, pipeline: str, holder: str) -> None:
        """Drop the lock if ``holder`` has it; a no-op otherwise. A store fenced on this
        pipeline's lock drops it only while it still carries the fence's token."""
        guard: Guard | None = getattr(self, "guard", None)
        where = [LOCKS.c.pipeline == pipeline, LOCKS.c.holder == holder]
        if guard is not None and guard.fence.pipeline == pipeline:
            # before the DELETE: a heartbeat that then finds it gone is not alarmed
            guard.released()
            where.append(LOCKS.c.token == guard.fence.token)
        with self._tx(fenced=False) as conn:
            conn.execute(delete(LOCKS).where(*where))

    def force_unlock(self, pipeline: str) -> None:
        """Drop the pipeline's lock whoever holds it (``tidemark reset --unlock``)."""
        with self._tx(fenced=False) as conn:
            row = conn.execute(select(LOCKS).where(LOCKS.c.pipeline == pipeline)).first()
            conn.execute(delete(LOCKS).where(LOCKS.c.pipeline == pipeline))
        if row is not None:
            log.warning(
                "removed the lock of pipeline %s held by run %s on host %s (pid %s)",
                pipeline,
                row.holder,
                row.hostname,
                row.pid,
            )
