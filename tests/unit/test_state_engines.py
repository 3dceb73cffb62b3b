"""State stores of one URL share an engine in a process (`state.schema.engine_for`): its
statement cache and connections outlive a store; a forked child opens its own; between the
runs of `run --every` no SQLite file stays open (`release_engines`)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.state import schema
from orchestrator.state.store import StateStore


def test_stores_of_one_url_share_an_engine_and_close_leaves_it_usable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    first = StateStore(url)
    first.close()
    second = StateStore(url)
    assert second._engine is first._engine
    second.acquire_lock("p", "holder-a")  # writes through the engine the closed store shared
    assert second.lock_info("p") is not None
    second.close()
    other = StateStore(f"sqlite:///{tmp_path / 'other.db'}")
    assert other._engine is not first._engine
    other.close()


def test_an_in_memory_store_is_a_database_of_its_own() -> None:
    first, second = StateStore("sqlite:///:memory:"), StateStore("sqlite:///:memory:")
    assert first._engine is not second._engine
    first.acquire_lock("p", "holder-a")
    assert second.lock_info("p") is None
    first.close()
    second.close()


def test_a_forked_child_opens_its_own_engine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    parent = StateStore(url)
    parent.acquire_lock("p", "holder-a")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a store of the same URL, a write of its own
        code = 1
        try:
            child = StateStore(url)
            fresh = child._engine is not parent._engine
            child.acquire_lock("q", "holder-b")
            code = 0 if fresh else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"\x00", "the child wrote through an engine of its own"
    os.waitpid(pid, 0)
    assert parent.lock_info("q") is not None
    parent.close()


def test_release_closes_idle_connections_and_keeps_the_engine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = StateStore(url)
    store.acquire_lock("p", "holder-a")
    engine = store._engine
    assert engine.pool.checkedin() >= 1  # an idle connection keeps the file open
    schema.release_engines()
    assert engine.pool.checkedin() == 0
    wal = tmp_path / "state.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0  # the last connection checkpointed it
    again = StateStore(url)
    assert again._engine is engine and again.lock_info("p") is not None
    again.close()
