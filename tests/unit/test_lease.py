"""One writer per run: the lease's heartbeat and the fence of the state store, on a real SQLite
file and a real PostgreSQL (tests/unit/conftest.py), the holder a real process
(``tests/unit/state_lease_worker.py``) that is paused with SIGSTOP past its lease."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from orchestrator.errors import LockLost, RunLocked
from orchestrator.state import lease
from orchestrator.state import store as state
from orchestrator.state.store import ChunkRecord, StateStore
from tests.unit.conftest import run_sql

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2  # seconds: the heartbeat renews every 0.4 s


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def line(worker: subprocess.Popen[str], send: str | None = None) -> str:
    assert worker.stdin is not None and worker.stdout is not None
    if send is not None:
        worker.stdin.write(send + "\n")
        worker.stdin.flush()
    return worker.stdout.readline().strip()


def test_a_renewed_lock_is_kept_and_a_paused_holder_is_fenced_out(
    store: StateStore, url: str
) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.state_lease_worker", url, "shop", "first", str(LEASE)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert line(worker) == "held"
        assert line(worker, "write") == "wrote"
        time.sleep(3 * LEASE)  # alive and renewed: three leases later it is still the holder's
        with pytest.raises(RunLocked, match=f"locked by run first .*lease {LEASE} s"):
            store.acquire_lock("shop", "second", lease_seconds=60)

        os.kill(worker.pid, signal.SIGSTOP)  # a frozen VM, a long GC: no renewal any more
        wait_for(lambda: stopped(worker.pid), "the worker to stop")

        def expired() -> bool:
            held = store.lock_info("shop")
            return held is not None and datetime.now(UTC) - held.refreshed_at > timedelta(
                seconds=LEASE + 0.5
            )

        wait_for(expired, "the lease to run out")
        store.acquire_lock("shop", "second", lease_seconds=60)  # only now: taken over
        runs = len(store.runs("shop"))
        os.kill(worker.pid, signal.SIGCONT)

        answer = line(worker, "write")  # its next write fails inside its own transaction
        assert answer.startswith(
            "lost lost the lock of pipeline shop: this process held it as run first"
        )
        assert (
            "run second (host " in answer
            and "took it over" in answer
            and "stops without writing" in answer
        )
        assert len(store.runs("shop")) == runs  # nothing written
        held = store.lock_info("shop")
        assert held is not None and held.holder == "second"  # and its heartbeat took nothing back
        assert line(worker, "exit") == ""
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
        worker.communicate()


def test_a_fenced_store_refuses_every_write_after_a_takeover(store: StateStore, url: str) -> None:
    fence = store.acquire_lock("shop", "first", lease_seconds=LEASE)
    fenced = StateStore(url, guard=fence)
    run_id = fenced.create_run("shop", {}).run_id  # the holder writes
    run_sql(url, update(state.LOCKS).values(refreshed_at=datetime.now(UTC) - timedelta(hours=1)))
    store.acquire_lock("shop", "second")
    chunk = ChunkRecord(
        run_id, "shop.t", 0, 0, None, None, "1", "pending", None, None, None, None, None, 0
    )
    try:
        for write in (
            lambda: fenced.create_run("shop", {}),
            lambda: fenced.add_run_table(
                run_id,
                "shop.t",
                "snapshot",
                strategy="even",
                chunk_key=["id"],
                info={},
                chunks=[chunk],
            ),
            lambda: fenced.finish_run(run_id, "failed", error="x"),
            lambda: fenced.save_capture_checkpoint(run_id, {"file": "b.000001", "pos": 4}, 1, 1),
        ):
            with pytest.raises(LockLost, match="took it over"):
                write()
        assert [r.run_id for r in store.runs("shop")] == [run_id]  # none of them wrote anything
        assert store.run_tables(run_id) == [] and store.chunks(run_id) == []
        assert (
            store.get_run(run_id).status == "running" and store.capture_checkpoint(run_id) is None
        )
        assert fenced.runs("shop")  # reading is not fenced
        fenced.release_lock("shop", "first")  # nor is releasing: only its own token would go
        held = store.lock_info("shop")
        assert held is not None and held.holder == "second"
    finally:
        fenced.close()


def test_the_heartbeat_renews_while_held_and_stops_cleanly(
    store: StateStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with lease.hold(url, "shop", "cli:here:1", lease_seconds=LEASE, track_pid=True) as held:
        assert lease.held("shop") is held
        first = store.lock_info("shop")
        assert first is not None
        wait_for(
            lambda: store.lock_info("shop").refreshed_at > first.refreshed_at,  # type: ignore[union-attr]
            "a renewal",
        )
        beat = held._thread
        assert beat.is_alive()
        with StateStore(url, guard=held) as fenced:  # a release by the holder is no loss
            fenced.release_lock("shop", "cli:here:1")
        assert store.lock_info("shop") is None
        time.sleep(
            2 * LEASE
        )  # the heartbeat stays quiet and takes nothing back; a write would be refused
        assert store.lock_info("shop") is None
        with pytest.raises(LockLost):
            held.check()
        released = held.fence.token
        held.take(
            None, True
        )  # the same holder's next run in this process (`tidemark run`'s second pass)
        assert held.fence.token != released
        with StateStore(url, guard=held) as fenced:
            fenced.create_run("shop", {})  # fenced by the new token
    assert not beat.is_alive() and lease.held("shop") is None
    kept = store.lock_info("shop")  # not released at the end of the block: the run releases it
    assert kept is not None and kept.holder == "cli:here:1"
    assert "lost the lock" not in caplog.text

    with (
        caplog.at_level(logging.WARNING, logger="tidemark.state"),
        lease.hold(url, "shop", "cli:here:1", lease_seconds=LEASE, track_pid=True) as held,
    ):
        store.force_unlock("shop")  # `tidemark reset --unlock` while it runs
        wait_for(lambda: "lost the lock of pipeline shop" in caplog.text, "the heartbeat to notice")
        with pytest.raises(LockLost, match="the lock was released"):
            held.check()
        with pytest.raises(LockLost):
            held.take(None, True)  # a lost lease is never taken again
    assert store.lock_info("shop") is None
