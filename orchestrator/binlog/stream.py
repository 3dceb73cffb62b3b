"""A replica's binlog stream: ``COM_BINLOG_DUMP`` over a PyMySQL connection, raw events out.

The server sends one packet per event, from the requested position to the
end of the binlog (``BINLOG_DUMP_NON_BLOCK``: an EOF packet then, rather than
waiting for more), rotating through the files by itself. This module only
frames: it hands over each event's bytes, and the caller parses what it needs.
PyMySQL does the handshake, authentication and packet reassembly.

A stream can also start from a GTID set instead of ``file:pos`` (``gtid=``), as a GTID
replica does: MariaDB's ``COM_BINLOG_DUMP`` after ``@slave_connect_state`` (strict mode),
MySQL's ``COM_BINLOG_DUMP_GTID``. The server then finds where that set ends in its own
binlog, or refuses (`GtidNotInBinlog`: the set is not in its binlog). That is how
`orchestrator.binlog.failover` finds a position on another server.

A hung source must not hang the run: the connection's read timeout
(``source.read_timeout``) bounds the wait for each packet, and the server is
asked for heartbeat events (``@master_heartbeat_period``) at a quarter of it,
so a healthy source that has nothing to send for a while still answers. While
no packet arrives, a line is logged every `WAITING_LOG_SECONDS` naming the
source and the position reached.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pymysql

from orchestrator.binlog import events as ev
from orchestrator.binlog.gtid import encode_mysql, parse_mysql
from orchestrator.config import SourceConfig
from orchestrator.errors import (
    BinlogConnectionLost,
    BinlogPurged,
    GtidNotInBinlog,
    RunFailed,
    source_timeout,
)
from orchestrator.source.dialect import Dialect
from orchestrator.source.tls import pymysql_settings

log = logging.getLogger(__name__)

#: While the stream waits for a packet, it says so this often (seconds).
WAITING_LOG_SECONDS = 30.0

_COM_BINLOG_DUMP = 0x12
_COM_BINLOG_DUMP_GTID = 0x1E
_BINLOG_DUMP_NON_BLOCK = 0x01
_BINLOG_THROUGH_GTID = 0x04
#: Errors meaning the connection dropped: client-side (gone, lost), the server shutting down
#: (1053), the connection killed on the server (1927).
_LOST = frozenset({2006, 2013, 1053, 1927})
#: ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested binlog cannot be read.
_FATAL_READING_BINLOG = 1236
#: HEARTBEAT_LOG_EVENT (MySQL, MariaDB) and MySQL 8's HEARTBEAT_LOG_EVENT_V2: "still here".
_HEARTBEATS = frozenset({27, 41})

Connect = Callable[..., "pymysql.connections.Connection[Any]"]


def dump_settings(source: SourceConfig, password: str) -> dict[str, Any]:
    """``pymysql.connect``'s arguments for a binlog connection to ``source`` (read and write
    waits bounded by ``source.read_timeout``)."""
    return {
        "host": source.host,
        "port": source.port,
        "user": source.user,
        "password": password,
        "connect_timeout": source.connect_timeout,
        "read_timeout": source.read_timeout,
        "write_timeout": source.read_timeout,
        "charset": "utf8mb4",
        **pymysql_settings(source.tls),
    }


def binlog_end(source: SourceConfig, password: str, timeout: int) -> tuple[str, int]:
    """Where the binlog of ``source`` ends now: its binlog status row's file and offset, asked on
    a connection of its own (the version its handshake gave picks the statement: `Dialect`),
    each wait at most ``timeout`` seconds (or ``source.connect_timeout`` to connect, if less)."""
    from orchestrator.source.connect import connect

    settings = dump_settings(source, password)
    settings["connect_timeout"] = min(timeout, source.connect_timeout)
    settings["read_timeout"] = settings["write_timeout"] = timeout
    conn = connect(**settings)
    try:
        with conn.cursor() as cur:
            cur.execute(Dialect.from_version(conn.get_server_info()).binlog_status_sql)
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None:
        raise RuntimeError("the source's binary log is off")
    return str(row[0]), int(row[1])


class DumpStream:
    """Raw events from ``file:pos`` to the end of the binlog, as one replica connection.

    Args:
        connect: opens the connection (``pymysql.connect``'s keyword arguments).
        settings: connection settings (host, port, user, password...).
        server_id: the replica id to ask as.
        file: the binlog file to start in.
        pos: the position in it (an event boundary).
        address: ``host:port`` for messages.
        gtid: start after this GTID set instead (``file`` and ``pos`` are then unused).
    """

    def __init__(
        self,
        connect: Connect,
        settings: dict[str, Any],
        server_id: int,
        file: str,
        pos: int,
        address: str,
        *,
        gtid: str | None = None,
    ) -> None:
        self._connect = connect
        self._settings = settings
        self.server_id = server_id
        self.file = file
        self.pos = pos
        self.address = address
        self.gtid = gtid
        self.read_timeout = int(settings.get("read_timeout") or 0)
        # the end of the last event received, for messages
        self.reached = f"{file}:{pos}" if gtid is None else f"GTID set {gtid}"
        self.last_heard = time.monotonic()
        self._conn: pymysql.connections.Connection[Any] | None = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def open(self) -> None:
        """Connect, agree on checksums, and ask for the binlog."""
        conn = self._conn = self._connect(**self._settings)
        flavor = Dialect.from_version(conn.get_server_info()).flavor
        with conn.cursor() as cur:
            # We read checksums: files written with them are sent with them (each file's
            # format description says whether its events have one), not refused.
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            # MariaDB: we understand GTID events (sent as they are, not as dummies).
            cur.execute("SET @mariadb_slave_capability = 4")
            if self.read_timeout:  # nanoseconds; a heartbeat well within the read timeout
                cur.execute("SET @master_heartbeat_period = %s", (self.read_timeout * 250_000_000,))
            if self.gtid is not None and flavor == "mariadb":  # what a GTID replica says
                cur.execute("SET @slave_connect_state = %s", (self.gtid,))
                cur.execute("SET @slave_gtid_strict_mode = 1")
                cur.execute("SET @slave_gtid_ignore_duplicates = 0")
        command = self._command(flavor)
        conn._write_bytes(struct.pack("<I", len(command))[:3] + b"\x00" + command)
        conn._next_seq_id = 1

    def _command(self, flavor: str) -> bytes:
        """The dump command: from ``file:pos``; from the GTID set (MariaDB: no file, the
        connect state says where); MySQL's ``COM_BINLOG_DUMP_GTID``: flags, server id, an
        empty file name (its length, u32), position 4 (u64), then the encoded set and its size."""
        if self.gtid is None:
            return (
                struct.pack(
                    "<BIHI", _COM_BINLOG_DUMP, self.pos, _BINLOG_DUMP_NON_BLOCK, self.server_id
                )
                + self.file.encode()
            )
        if flavor == "mariadb":
            return struct.pack("<BIHI", _COM_BINLOG_DUMP, 4, _BINLOG_DUMP_NON_BLOCK, self.server_id)
        data = encode_mysql(parse_mysql(self.gtid))
        return (
            struct.pack(
                "<BHIIQI",
                _COM_BINLOG_DUMP_GTID,
                _BINLOG_DUMP_NON_BLOCK | _BINLOG_THROUGH_GTID,
                self.server_id,
                0,
                4,
                len(data),
            )
            + data
        )

    def __iter__(self) -> Iterator[bytes]:
        """Each event's packet (0x00, header, body, checksum) until the end of the binlog."""
        if self._conn is None:
            self.open()
        conn = self._conn
        assert conn is not None
        read = conn._read_packet
        done = threading.Event()
        watcher = threading.Thread(
            target=self._say_waiting, args=(done,), daemon=True, name="tidemark-binlog-wait"
        )
        watcher.start()
        try:
            while True:
                try:
                    data: bytes = read()._data
                except pymysql.err.MySQLError as exc:
                    raise self._failure(exc) from exc
                self.last_heard = time.monotonic()
                if data[0] == 0x00 and len(data) >= ev.BODY:
                    self._note(data)
                    if data[5] not in _HEARTBEATS:
                        yield data
                elif data[0] == 0xFE and len(data) < 9:  # EOF: the end of the binlog
                    return
                elif data[0] == 0x00:
                    raise RunFailed(
                        f"the binlog of {self.address} sent a packet too short for an "
                        f"event after {self.reached} ({len(data)} bytes)"
                    )
        finally:
            done.set()

    def _note(self, data: bytes) -> None:
        """Remember where the stream is (for the messages of a stall or a failure)."""
        kind, end = ev.header(data)
        if kind == ev.ROTATE:
            file, pos = ev.rotate(data)
            self.reached = f"{file}:{pos}"
        elif end:
            self.reached = f"{self.reached.rsplit(':', 1)[0]}:{end}"

    def _say_waiting(self, done: threading.Event) -> None:
        """Log a line every `WAITING_LOG_SECONDS` while no packet arrives."""
        said = time.monotonic()
        while not done.wait(1.0):
            now = time.monotonic()
            idle = now - self.last_heard
            if idle >= WAITING_LOG_SECONDS and now - said >= WAITING_LOG_SECONDS:
                said = now
                log.warning(
                    "waiting for the binlog of %s: no event for %.0f s, position %s "
                    "(the run fails after %d s: source.read_timeout)",
                    self.address,
                    idle,
                    self.reached,
                    self.read_timeout,
                )

    def _failure(self, exc: pymysql.err.MySQLError) -> Exception:
        code = exc.args[0] if exc.args else None
        message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        if code in _LOST and "timed out" in message:
            return source_timeout(
                self.address, self.read_timeout, f"the binlog after {self.reached}"
            )
        if code == _FATAL_READING_BINLOG and self.gtid is not None:
            return GtidNotInBinlog(
                f"{self.address} cannot send its binlog after GTID set {self.gtid}: {message}"
            )
        if code in _LOST:
            return BinlogConnectionLost(
                f"lost the binlog connection to {self.address} after "
                f"{self.reached}; the capture resumes from its last checkpoint"
            )
        if code == _FATAL_READING_BINLOG and "first log" in message.lower():
            return BinlogPurged(
                f"binlog file {self.file} is no longer on {self.address} "
                f"({message}); keep binlogs longer (binlog_expire_logs_seconds)"
            )
        return RunFailed(
            f"reading the binlog of {self.address} from {self.file}:{self.pos} failed: {message}"
        )
