"""Binlog events as bytes: the common header and the bodies the capture reads.

An event, as the replication stream sends it, is one packet: a 0x00 byte, the
19-byte common header (timestamp, type, server id, size, next position,
flags), the body, and 4 bytes of CRC32 when ``binlog_checksum`` is on. Offsets
below are into that packet, so no event is ever copied.

Layouts follow the MySQL and MariaDB replication protocol documentation
(``Rotate_event``, ``Query_event``, ``Gtid_event``, ``Table_map_event``,
``Rows_event``).
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass
from typing import Literal

#: Offset of the body in a stream packet: the 0x00 byte, then the common header.
BODY = 20

# Event types (Log_event_type), the ones the reader acts on.
QUERY = 2
ROTATE = 4
FORMAT_DESCRIPTION = 15
XID = 16
TABLE_MAP = 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
WRITE_ROWS, UPDATE_ROWS, DELETE_ROWS = 30, 31, 32
XA_PREPARE = 38
PARTIAL_UPDATE_ROWS = 39
#: MySQL's GTID events: a transaction's GTID, and the placeholder when GTIDs are off.
MYSQL_GTID, MYSQL_ANONYMOUS_GTID = 33, 34
#: MySQL's compressed transaction (binlog_transaction_compression=ON; see `compressed`).
TRANSACTION_PAYLOAD = 40
MARIADB_GTID = 162
MARIADB_GTID_LIST = 163
#: MariaDB's compressed rows events (log_bin_compress=ON; see `compressed`).
MARIADB_COMPRESSED_ROWS = frozenset(range(166, 172))
MARIADB_COMPRESSED_QUERY = 165
#: LOAD DATA logged as a statement: a QUERY event's layout with 13 more bytes of post-header.
EXECUTE_LOAD_QUERY = 18
#: The server lost events here (a replica stops): nothing after it can be trusted to be complete.
INCIDENT = 26
#: Events that change no row by themselves: the statement context of a QUERY (INTVAR, RAND,
#: USER_VAR), LOAD DATA's file blocks (executed by EXECUTE_LOAD_QUERY), annotations, GTID
#: bookkeeping, heartbeats, STOP, MariaDB's checkpoints and encryption start. Any type neither
#: acted on nor listed here fails the capture: it is never skipped unread.
HARMLESS = frozenset(
    {3, 5, 9, 11, 13, 14, 17, 27, 28, 29, 34, 35, 36, 37, 41, 160, 161, MARIADB_GTID_LIST, 164}
)

#: Rows event type -> the change it carries.
ROWS_OPS: dict[int, Literal["I", "U", "D"]] = {
    WRITE_ROWS_V1: "I",
    WRITE_ROWS: "I",
    UPDATE_ROWS_V1: "U",
    UPDATE_ROWS: "U",
    DELETE_ROWS_V1: "D",
    DELETE_ROWS: "D",
}

_HEADER = struct.Struct("<xIBIIIH")
#: LOG_EVENT_ARTIFICIAL_F: an event the server made up for this stream (not in the file).
ARTIFICIAL = 0x20
_MARIADB_FL_STANDALONE = 0x01
_MARIADB_FL_PREPARED_XA = 0x40


def header(packet: bytes) -> tuple[int, int]:
    """``(event type, next position)`` of a stream packet (next position 0 for fake events)."""
    _, kind, _, _, end, _ = _HEADER.unpack_from(packet)
    return kind, end


def placed(packet: bytes) -> tuple[int, int, bool]:
    """``(start, end, artificial)`` of a stream packet's event in its binlog file: the next
    position minus the event's size, the next position, and whether the server made it up."""
    _, _, _, size, end, flags = _HEADER.unpack_from(packet)
    return end - size, end, bool(flags & ARTIFICIAL)


def lenenc(data: bytes, pos: int) -> tuple[int, int]:
    """A length-encoded integer at ``pos``: ``(value, position after it)``.

    >>> lenenc(bytes([250]), 0), lenenc(bytes([252, 1, 2]), 0)
    ((250, 1), (513, 3))
    """
    first = data[pos]
    if first < 251:
        return first, pos + 1
    width = {252: 2, 253: 3, 254: 8}.get(first)
    if width is None:
        raise ValueError(f"bad length-encoded integer 0x{first:02x} at offset {pos}")
    return int.from_bytes(data[pos + 1 : pos + 1 + width], "little"), pos + 1 + width


@dataclass(frozen=True, slots=True)
class Format:
    """What the format description event says about the events after it.

    Attributes:
        post_headers: the post-header length of each event type (index ``type - 1``).
        checksum: bytes of checksum at the end of every event of the file (0 or 4; each
            file has its own, from ``binlog_checksum`` when it was written).
        server_version: the version of the server that wrote the binlog.
    """

    post_headers: bytes = b""
    checksum: int = 4
    server_version: str = ""

    def post_header(self, kind: int, default: int) -> int:
        index = kind - 1
        return self.post_headers[index] if 0 <= index < len(self.post_headers) else default

    def end(self, packet: bytes) -> int:
        """The offset where the event's body ends (its checksum excluded)."""
        return len(packet) - self.checksum

    @classmethod
    def parse(cls, packet: bytes) -> Format:
        """The format description event: version (2), server version (50), created (4),
        header length (1), the post-header lengths, then the checksum algorithm of the
        file's events (1: 0 is none, 1 is CRC32) and this event's checksum (4, always)."""
        start = BODY + 2 + 50 + 4 + 1
        version = bytes(packet[BODY + 2 : BODY + 52]).rstrip(b"\0").decode("ascii", "replace")
        checksum = 0 if packet[-5] == 0 else 4
        return cls(bytes(packet[start : len(packet) - 5]), checksum, version)


def rotate(packet: bytes) -> tuple[str, int]:
    """``(next file, position in it)`` of a ROTATE event.

    The one the server makes up on connecting comes before any format
    description, so whether it has a checksum is read off the event itself.
    """
    end = len(packet) - 4 if has_checksum(packet) else len(packet)
    position = int.from_bytes(packet[BODY : BODY + 8], "little")
    return bytes(packet[BODY + 8 : end]).decode(), position


def has_checksum(packet: bytes) -> bool:
    """Whether the event ends with the CRC32 of the rest of it."""
    return len(packet) >= BODY + 4 and zlib.crc32(packet[1:-4]) == int.from_bytes(
        packet[-4:], "little"
    )


def query_event(packet: bytes, fmt: Format, kind: int = QUERY) -> tuple[str, str]:
    """``(default database, statement)`` of a QUERY (or EXECUTE_LOAD_QUERY) event: thread id
    (4), exec time (4), database length (1), error code (2), status variables' length (2), for
    EXECUTE_LOAD_QUERY 13 bytes more, then the status variables, the database and a NUL, and
    the statement."""
    schema_length = packet[BODY + 8]
    schema = _status_vars(packet, fmt, kind)[1]
    database = bytes(packet[schema : schema + schema_length]).decode("utf-8", "replace")
    statement = bytes(packet[schema + schema_length + 1 : fmt.end(packet)])
    return database, statement.decode("utf-8", "replace").strip()


def _status_vars(packet: bytes, fmt: Format, kind: int) -> tuple[int, int]:
    """Where a QUERY (or EXECUTE_LOAD_QUERY) event's status variables start and end."""
    start = BODY + fmt.post_header(kind, 13 if kind == QUERY else 26)
    return start, start + int.from_bytes(packet[BODY + 11 : BODY + 13], "little")


#: The ``sql_mode`` bits that change how a logged statement's text reads.
MODE_ANSI_QUOTES = 0x4
MODE_NO_BACKSLASH_ESCAPES = 0x100000


def query_sql_mode(packet: bytes, fmt: Format, kind: int = QUERY) -> int:
    """The session ``sql_mode`` a QUERY event's statement ran in (0 when the event has none).

    The server writes the status variables Q_FLAGS2_CODE (0: 4 bytes) and Q_SQL_MODE_CODE (1:
    8 bytes) first; the scan stops at any other key."""
    at, end = _status_vars(packet, fmt, kind)
    while at < end:
        key = packet[at]
        if key == 0:
            at += 5
        elif key == 1:
            return int.from_bytes(packet[at + 1 : at + 9], "little")
        else:
            break
    return 0


def gtid_prepared_xa(packet: bytes) -> bool:
    """Whether a MariaDB GTID event starts the event group of an XA transaction (XA START)."""
    return bool(packet[BODY + 12] & _MARIADB_FL_PREPARED_XA)


def gtid_standalone(packet: bytes) -> bool:
    """Whether a MariaDB GTID event starts a standalone event group (DDL: no BEGIN/COMMIT)."""
    return bool(packet[BODY + 12] & _MARIADB_FL_STANDALONE)


def table_id(packet: bytes, fmt: Format, kind: int) -> int:
    """The table id of a TABLE_MAP or rows event (6 bytes; 4 in ancient formats)."""
    width = 4 if fmt.post_header(kind, 8) == 6 else 6
    return int.from_bytes(packet[BODY : BODY + width], "little")


# --------------------------------------------------------------------------- table maps

# Column types (enum_field_types) whose TABLE_MAP metadata is 1 or 2 bytes; others have none.
# MariaDB's COMPRESSED columns: 140 is a BLOB's (one byte), 141 a VARCHAR's (two).
_META_ONE = frozenset({4, 5, 17, 18, 19, 245, 252, 255, 140})  # float double *2 json blob geometry
_META_TWO = frozenset(
    {15, 16, 246, 247, 248, 253, 254, 141}
)  # varchar bit newdecimal enum set strings


@dataclass(frozen=True, slots=True)
class TableMap:
    """A TABLE_MAP event: which table a table id stands for, and its columns' binlog types.

    Attributes:
        table_id: the id rows events refer to (valid until the next rotation).
        name: ``database.table``.
        types: the binlog type of each column (enum_field_types).
        meta: each column's metadata bytes (lengths, precision, fsp...), b"" if none.
        packet: the whole event, for python-mysql-replication's decoder.
        optional: the optional metadata block (`orchestrator.binlog.metadata`), b"" if none.
    """

    table_id: int
    name: str
    types: bytes
    meta: tuple[bytes, ...]
    packet: bytes
    optional: bytes = b""

    @property
    def signature(self) -> tuple[str, bytes, tuple[bytes, ...]]:
        """Equal for table maps of the same table shape (a row decoder can be reused)."""
        return self.name, self.types, self.meta


def table_map_name(packet: bytes, fmt: Format) -> str:
    """The ``database.table`` of a TABLE_MAP event (read before deciding to parse the rest)."""
    pos = BODY + fmt.post_header(TABLE_MAP, 8)
    schema = bytes(packet[pos + 1 : pos + 1 + packet[pos]])
    pos += 2 + len(schema)
    table = bytes(packet[pos + 1 : pos + 1 + packet[pos]])
    return f"{schema.decode()}.{table.decode()}"


def parse_table_map(packet: bytes, fmt: Format) -> TableMap:
    """A TABLE_MAP event: ids, names, column types and their metadata."""
    pos = BODY + fmt.post_header(TABLE_MAP, 8)
    pos += 2 + packet[pos]  # schema length, schema, NUL
    pos += 2 + packet[pos]  # table length, table, NUL
    count, pos = lenenc(packet, pos)
    types = bytes(packet[pos : pos + count])
    length, pos = lenenc(packet, pos + count)  # the metadata block's length
    optional = pos + length + (count + 7) // 8  # after the metadata and the NULL bitmap
    meta = []
    for kind in types:
        width = 1 if kind in _META_ONE else 2 if kind in _META_TWO else 0
        meta.append(bytes(packet[pos : pos + width]))
        pos += width
    return TableMap(
        table_id(packet, fmt, TABLE_MAP),
        table_map_name(packet, fmt),
        types,
        tuple(meta),
        bytes(packet),
        bytes(packet[optional : fmt.end(packet)]),
    )


@dataclass(frozen=True, slots=True)
class RowsLayout:
    """Where the rows of a rows event are.

    Attributes:
        columns: the number of columns of the table.
        full: whether every column is present in every image (``binlog_row_image=FULL``).
        start: offset of the first row.
        end: offset after the last row.
        flags: the event's flags (`NO_FOREIGN_KEY_CHECKS`...).
    """

    columns: int
    full: bool
    start: int
    end: int
    flags: int = 0

    @property
    def checked_foreign_keys(self) -> bool:
        """Whether the session that wrote the rows had ``foreign_key_checks`` on: with it off,
        the engine ran no foreign-key action for them."""
        return not self.flags & NO_FOREIGN_KEY_CHECKS


#: A rows event's flag: the session had ``foreign_key_checks=0`` (the server's
#: ``NO_FOREIGN_KEY_CHECKS_F``, log_event.h; the same bit in MariaDB and MySQL).
NO_FOREIGN_KEY_CHECKS = 0x02


def rows_layout(packet: bytes, fmt: Format, kind: int) -> RowsLayout:
    """Parse a rows event's header: table id, flags, (v2) extra data, columns, present bitmaps."""
    version1 = kind in (WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1)
    width = 4 if fmt.post_header(kind, 8) == 6 else 6  # the table id's, as `table_id` reads it
    flags = int.from_bytes(packet[BODY + width : BODY + width + 2], "little")
    pos = BODY + fmt.post_header(kind, 8 if version1 else 10)
    if not version1:  # v2: the post-header ends with the length of the extra data (itself included)
        pos += int.from_bytes(packet[BODY + 8 : BODY + 10], "little") - 2
    count, pos = lenenc(packet, pos)
    width = (count + 7) // 8
    images = 2 if kind in (UPDATE_ROWS_V1, UPDATE_ROWS) else 1
    start = pos + images * width
    if start > len(packet):  # a damaged count: never build a bitmap of it
        raise ValueError(f"a rows event of {count} columns ends inside its bitmaps")
    full = packet[pos:start] == _all_ones(count) * images
    return RowsLayout(count, full, start, fmt.end(packet), flags)


@functools.lru_cache(maxsize=64)
def _all_ones(count: int) -> bytes:
    """The bitmap of ``count`` columns all set.

    >>> _all_ones(10).hex()
    'ff03'
    """
    return ((1 << count) - 1).to_bytes((count + 7) // 8, "little")
