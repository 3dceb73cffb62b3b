"""A held pipeline lock: renewed by a heartbeat while its holder lives, the fence of its writes.

`hold` takes the lock (`PipelineLockMixin.acquire_lock`) and keeps it alive: a daemon
thread renews the lease every `renew_interval` seconds for as long as the block runs, a
Spark job or a long capture included, and once more when the block ends (an Airflow
task's lease then counts from its end). The `Lease` is registered for the process, so
every store a step opens for the pipeline (`orchestrator.pipeline.context.open_store`) is
bound to it: each writing transaction confirms the fence first, and `StateStore.check_fence`
asks it before a file of the run is written or deleted.

A lease that was lost stays lost: the heartbeat that finds the token changed marks it, and
every later check raises the same `LockLost` without asking the store. Between renewals
the lease trusts its own clocks: a check within half the lease of the last confirmation
needs no query (a takeover needs a whole lease without a renewal); after a pause (SIGSTOP,
a frozen VM, a long GC) the monotonic and wall clocks have moved on and the check asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from orchestrator.errors import LockLost
from orchestrator.services import faults
from orchestrator.state.lock import Fence, confirm_fence
from orchestrator.state.store import StateStore

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("tidemark.state")

_HELD: dict[str, Lease] = {}
_HELD_LOCK = threading.Lock()


def renew_interval(lease_seconds: float) -> float:
    """How often the heartbeat renews: five times per lease, at least once a minute.

    >>> renew_interval(900), renew_interval(6), renew_interval(0.5)
    (60.0, 1.2, 0.2)
    """
    return max(0.2, min(60.0, lease_seconds / 5))


class Lease:
    """The pipeline lock this process holds (`orchestrator.state.lock.Guard`)."""

    def __init__(self, store: StateStore, fence: Fence) -> None:
        self.store, self.fence = store, fence
        self._lost: LockLost | None = None
        self._released = False
        self._stop = threading.Event()
        self._confirmed = (time.monotonic(), time.time())
        self._thread = threading.Thread(
            target=self._beat, name=f"tidemark-lease-{fence.pipeline}", daemon=True
        )

    def __str__(self) -> str:
        state = "lost" if self._lost else "released" if self._released else "held"
        return f"{self.fence} ({state}, lease {self.fence.lease_seconds} s)"

    # --- Guard ------------------------------------------------------------------------
    def confirm(self, conn: Connection) -> None:
        if self._lost is not None:
            raise self._lost
        started = (time.monotonic(), time.time())
        try:
            confirm_fence(conn, self.fence)
        except LockLost as exc:
            self._lose(exc)
            raise
        self._confirmed = started

    def check(self) -> None:
        if self._lost is not None:
            raise self._lost
        now = (time.monotonic(), time.time())
        since = max(now[0] - self._confirmed[0], now[1] - self._confirmed[1])
        if since >= self.fence.lease_seconds / 2:
            self.renew()

    def released(self) -> None:
        self._released = True

    # --- holding --------------------------------------------------------------------------
    def renew(self) -> None:
        """Renew the lease now (`LockLost` once it is not this process's any more)."""
        if self._lost is not None:
            raise self._lost
        started = (time.monotonic(), time.time())
        with faults.QUIET:  # a test's pause never lands inside this transaction
            try:
                self.store.renew_lock(self.fence)
            except LockLost as exc:
                self._lose(exc)
                raise
        self._confirmed = started

    def take(self, config_path: str | None, track_pid: bool) -> None:
        """Take the lock again for the same holder (a step that re-takes it): renews it, or,
        after this process released it, takes it anew under a new token. A lost lease is
        never taken again: the process that lost it must stop."""
        if self._lost is not None:
            raise self._lost
        if not self._released:
            self.renew()
            return
        self.fence = self.store.acquire_lock(
            self.fence.pipeline,
            self.fence.holder,
            lease_seconds=self.fence.lease_seconds,
            config_path=config_path,
            track_pid=track_pid,
        )
        self._released = False
        self._confirmed = (time.monotonic(), time.time())

    def _lose(self, exc: LockLost) -> None:
        if self._released:  # released by this process: not its lock any more, but nothing lost
            return
        if self._lost is None:  # a warning: the run's one error line says it
            log.warning("%s", exc)
            self._lost = exc

    def _beat(self) -> None:
        interval = renew_interval(self.fence.lease_seconds)
        while not self._stop.wait(interval):
            if self._released:
                continue
            try:
                self.renew()
            except LockLost:
                if not self._released:
                    return  # logged once by _lose; the run's next check stops it
            except Exception as exc:  # a state store that is briefly unreachable: try again
                log.warning(
                    "could not renew %s (%s); trying again in %.0f s", self.fence, exc, interval
                )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeat (joins the thread), then renew once more unless released or lost."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._lost is None and not self._released:
            try:
                self.renew()
            except Exception as exc:  # ending a block must not turn success into failure
                log.warning("could not renew %s at the end of the step: %s", self.fence, exc)


def forked(pipeline: str, url: str) -> None:
    """In a process forked from the lock's holder (publish's workers): the holder's lease, checked
    and renewed through a store of this process's own (a database connection is never shared
    across a fork) and without a heartbeat of its own (the holder's keeps the lock alive; a check
    here renews it when half the lease passed since this process last confirmed it). ``url``: the
    state store's (`state.url`)."""
    global _HELD_LOCK
    _HELD_LOCK = threading.Lock()  # another thread of the holder may have held it at the fork
    holder = _HELD.get(pipeline)
    if holder is None:
        return
    lease = Lease(StateStore(url), holder.fence)
    lease._confirmed, lease._lost, lease._released = (
        holder._confirmed,
        holder._lost,
        holder._released,
    )
    _HELD[pipeline] = lease


def held(pipeline: str) -> Lease | None:
    """The lease this process holds on ``pipeline``'s lock, if any."""
    with _HELD_LOCK:
        return _HELD.get(pipeline)


@contextmanager
def hold(
    url: str,
    pipeline: str,
    holder: str,
    *,
    lease_seconds: int,
    track_pid: bool,
    config_path: str | None = None,
) -> Iterator[Lease]:
    """Take the pipeline lock for ``holder`` and keep it alive for the block.

    Nested blocks of the same holder share the outer lease. The lock is not released at the
    end: the run releases it when it ends (publish, or a failure), and an Airflow run's next
    task takes it again.

    Raises:
        RunLocked: another holder's lock is live.
        LockLost: (from the block) the lock was taken over meanwhile.
    """
    outer = held(pipeline)
    if outer is not None and outer.fence.holder == holder:
        outer.take(config_path, track_pid)
        yield outer
        return
    store = StateStore(url)
    try:
        fence = store.acquire_lock(
            pipeline,
            holder,
            lease_seconds=lease_seconds,
            config_path=config_path,
            track_pid=track_pid,
        )
        lease = Lease(store, fence)
        with _HELD_LOCK:
            _HELD[pipeline] = lease
        lease.start()
        try:
            yield lease
        finally:
            with _HELD_LOCK:
                if outer is None:
                    _HELD.pop(pipeline, None)
                else:
                    _HELD[pipeline] = outer
            lease.stop()
    finally:
        store.close()
