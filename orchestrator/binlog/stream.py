"""A replica's binlog stream: ``COM_BINLOG_DUMP`` over a PyMySQL connection, raw events out.

The server sends one packet per event, from the requested position to the
end of the binlog (``BINLOG_DUMP_NON_BLOCK``: an EOF packet then, rather than
waiting for more), rotating through the files by itself. This module only
frames: it hands over each event's bytes, and the caller parses what it needs.
PyMySQL does the handshake, authentication and packet reassembly.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import pymysql

from orchestrator.errors import BinlogPurged, RunFailed

_COM_BINLOG_DUMP = 0x12
_BINLOG_DUMP_NON_BLOCK = 0x01
#: Client-side errors meaning the connection dropped.
_LOST = frozenset({2006, 2013})
#: ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested binlog cannot be read.
_FATAL_READING_BINLOG = 1236

Connect = Callable[..., "pymysql.connections.Connection[Any]"]


class DumpStream:
    """Raw events from ``file:pos`` to the end of the binlog, as one replica connection.

    Args:
        connect: opens the connection (``pymysql.connect``'s keyword arguments).
        settings: connection settings (host, port, user, password...).
        server_id: the replica id to ask as.
        file: the binlog file to start in.
        pos: the position in it (an event boundary).
        address: ``host:port`` for messages.
    """

    def __init__(self, connect: Connect, settings: dict[str, Any], server_id: int, file: str,
                 pos: int, address: str) -> None:
        self._connect = connect
        self._settings = settings
        self.server_id = server_id
        self.file = file
        self.pos = pos
        self.address = address
        self._conn: pymysql.connections.Connection[Any] | None = None

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def open(self) -> None:
        """Connect, agree on checksums, and ask for the binlog."""
        conn = self._conn = self._connect(**self._settings)
        with conn.cursor() as cur:
            # We read checksums: files written with them are sent with them (each file's
            # format description says whether its events have one), not refused.
            cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            # MariaDB: we understand GTID events (sent as they are, not as dummies).
            cur.execute("SET @mariadb_slave_capability = 4")
        name = self.file.encode()
        command = struct.pack("<BIHI", _COM_BINLOG_DUMP, self.pos, _BINLOG_DUMP_NON_BLOCK,
                              self.server_id) + name
        conn._write_bytes(struct.pack("<I", len(command))[:3] + b"\x00" + command)
        conn._next_seq_id = 1

    def __iter__(self) -> Iterator[bytes]:
        """Each event's packet (0x00, header, body, checksum) until the end of the binlog."""
        if self._conn is None:
            self.open()
        conn = self._conn
        assert conn is not None
        read = conn._read_packet
        while True:
            try:
                data: bytes = read()._data
            except pymysql.err.MySQLError as exc:
                raise self._failure(exc) from exc
            if data[0] == 0x00:
                yield data
            elif data[0] == 0xFE and len(data) < 9:  # EOF: the end of the binlog
                return

    def _failure(self, exc: pymysql.err.MySQLError) -> Exception:
        code = exc.args[0] if exc.args else None
        message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        if code in _LOST:
            return RunFailed(f"lost the binlog connection to {self.address}; "
                             "a rerun resumes the capture from its last checkpoint")
        if code == _FATAL_READING_BINLOG and "first log" in message.lower():
            return BinlogPurged(f"binlog file {self.file} is no longer on {self.address} "
                                f"({message}); keep binlogs longer (binlog_expire_logs_seconds)")
        return RunFailed(f"reading the binlog of {self.address} from {self.file}:{self.pos} "
                         f"failed: {message}")
