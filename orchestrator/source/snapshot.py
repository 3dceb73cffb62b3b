"""A read of a whole table at one binlog position, without a key to chunk on and without locks.

A table without a key is published as the multiset of its rows (docs/design.md, "Tables without a
key"), and its changes are applied by count, so its read must be the table at one known position
exactly: replaying a change the read already saw would count it twice. One connection starts a
transaction with ``START TRANSACTION WITH CONSISTENT SNAPSHOT``; every read on it sees the same
rows. Where that snapshot is at in the binlog depends on the server (`how_to_snapshot`):

- ``snapshot``: MariaDB (and Percona Server) give the binlog position of that very snapshot in
  ``binlog_snapshot_file`` / ``binlog_snapshot_position`` (``SHOW STATUS`` in the transaction): the
  server takes the snapshot and the position under the binlog's commit lock, so the snapshot holds
  exactly the transactions written before that position (`begin_snapshot`);
- ``quiet``: MySQL gives no such position. A position ``L`` is recorded, the read margin waited
  (a transaction in the binlog before ``L`` is visible by then), the snapshot started, and a
  position ``H`` recorded: the snapshot holds every transaction up to ``L``, none after ``H``, and
  maybe some in between. When the binlog shows no change of the table in ``(L, H]`` the snapshot is
  the table at ``H`` (`begin_window`; the caller reads the binlog, retries otherwise);
- ``lock``: only where the config allows it (``tables[].keyless_lock``) on a server without the
  snapshot position: ``LOCK TABLES t READ`` on a second connection (it waits for every transaction
  that wrote the table to end, and holds off new ones), the snapshot started and the position
  recorded, then the lock released at once: the table at that position (`begin_locked`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from chunking.mysql import quote_table
from orchestrator.errors import TransientReadError
from orchestrator.positions import BinlogPosition, ServerIdentity
from orchestrator.source.connection import Source

#: How a table without a key is read at one position (module docstring).
SnapshotMethod = Literal["snapshot", "quiet", "lock"]

START = "START TRANSACTION WITH CONSISTENT SNAPSHOT"
#: Asked before `START`: only REPEATABLE READ takes the snapshot. A server (or user) whose
#: transactions read committed rows (``transaction_isolation`` READ-COMMITTED) ignores ``WITH
#: CONSISTENT SNAPSHOT``, and a write committed after the snapshot's position but before the
#: read was read, then applied again from the binlog: a row counted twice.
REPEATABLE = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
_STATUS = "SHOW STATUS LIKE 'binlog_snapshot_%'"


def _start(source: Source) -> None:
    """Begin the snapshot's transaction, REPEATABLE READ whatever the session's default."""
    source.query(REPEATABLE)
    source.query(START)


def _snapshot_status(source: Source) -> tuple[str, int] | None:
    """``binlog_snapshot_file`` and ``binlog_snapshot_position`` of the session, None when the
    server has none (MySQL)."""
    status = {str(name).lower(): value for name, value in source.query(_STATUS)}
    file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
    if not file or pos is None:
        return None
    return str(file), int(pos)


def how_to_snapshot(source: Source, *, lock_allowed: bool) -> SnapshotMethod:
    """How this server reads a table without a key at one position (module docstring).

    Args:
        source: the source.
        lock_allowed: the table's config allows a brief ``LOCK TABLES ... READ``
            (``tables[].keyless_lock``); only used where the server gives no snapshot position.
    """
    if _snapshot_status(source) is not None:
        return "snapshot"
    return "lock" if lock_allowed else "quiet"


def _began(source: Source, connections: int) -> None:
    """Fail (to be tried again) when ``source`` reconnected since ``connections``: the
    transaction begun on the old connection is gone."""
    if source.connections != connections:
        raise TransientReadError(
            f"lost the connection to {source.address} while a consistent snapshot began"
        )


def _connected(source: Source) -> int:
    source.query("SELECT 1")  # opens the connection if it is not open
    return source.connections


def begin_snapshot(source: Source) -> BinlogPosition:
    """Start a consistent snapshot on ``source``'s connection; the binlog position it is at
    (`SnapshotMethod` ``snapshot``), with the server's identity and GTID set there.

    Raises:
        TransientReadError: the connection was lost meanwhile (try again).
        RuntimeError: the server gives no snapshot position (use `how_to_snapshot` first).
    """
    connections = _connected(source)
    _start(source)
    found = _snapshot_status(source)
    if found is None:
        raise RuntimeError(f"{source.address} gives no binlog_snapshot_position")
    file, pos = found
    dialect = source.dialect
    server_id, server_uuid, gtid = source.query(
        dialect.position_identity_sql, (file, pos) if dialect.flavor == "mariadb" else None
    )[0]
    _began(source, connections)
    return BinlogPosition(file, pos).on(
        ServerIdentity(int(server_id), None if server_uuid is None else str(server_uuid)),
        str(gtid).replace("\n", "") if gtid else None,
    )


def begin_window(source: Source, margin: float) -> tuple[BinlogPosition, BinlogPosition]:
    """Record ``L``, wait ``margin`` seconds, start a consistent snapshot, record ``H``
    (`SnapshotMethod` ``quiet``): the snapshot is the table at ``H`` when the binlog holds no
    change of it in ``(L, H]``, which the caller checks."""
    connections = _connected(source)
    low = source.current_position()
    time.sleep(margin)
    _start(source)
    high = source.current_position()
    _began(source, connections)
    return low, high


def begin_locked(source: Source, locker: Source, table: str) -> BinlogPosition:
    """Start a consistent snapshot on ``source`` while ``locker`` holds ``table`` read-locked
    (`SnapshotMethod` ``lock``); the position then. The lock is held only while the snapshot
    starts."""
    connections = _connected(source)
    locker.query(f"LOCK TABLES {quote_table(table)} READ")
    try:
        _start(source)
        position = source.current_position()
    finally:
        locker.query("UNLOCK TABLES")
    _began(source, connections)
    return position


@contextmanager
def ended(source: Source) -> Iterator[Source]:
    """``source``, its transaction ended (``ROLLBACK``: it only read) however the block ends; a
    connection lost meanwhile is closed."""
    try:
        yield source
    finally:
        try:
            source.query("ROLLBACK")
        except Exception:  # a lost connection: the server ended the transaction
            source.close()
