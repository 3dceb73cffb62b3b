"""Compressed binlog events, turned back into the ordinary events they stand for.

MariaDB (``log_bin_compress=ON``) compresses a QUERY event's statement and a
rows event's row images with zlib, each event on its own: type 165 is a
compressed QUERY, 166-168 compressed v1 rows events (write/update/delete),
169-171 compressed v2 ones. Everything before the compressed part (post-header,
status variables and database of a QUERY; the table id, flags, extra data,
column count and present-bitmaps of a rows event) is as in the plain event. The
compressed part is one header byte (bit 7 set, bits 4-6 the algorithm, 0 for
zlib, bits 0-2 the number of bytes of the length), the uncompressed length
(big-endian), then the zlib stream.

MySQL (``binlog_transaction_compression=ON``) packs a whole transaction into one
TRANSACTION_PAYLOAD event (type 40): a header of typed fields - each a
length-encoded type, length and value; 1 is the payload size, 2 the compression
type (0 zstd, 255 none), 3 the uncompressed size, 0 ends the header - then the
payload: the transaction's events one after the other, each with its 19-byte
header and without a checksum.

`expand` rebuilds the plain events as stream packets (checksum as the file's
format says), so they go through exactly the same path as uncompressed ones.
An event keeps its position: the end of the compressed event, for every event of
a MySQL payload (a transaction boundary inside it is the payload's end, so no
checkpoint ever points inside a payload). A payload that cannot be decoded is an
error naming its position - never a skipped event.
"""

from __future__ import annotations

import struct
import zlib

import zstandard

from orchestrator.binlog import events as ev
from orchestrator.errors import RunFailed

#: MariaDB's compressed event type -> the plain event type it stands for.
MARIADB_PLAIN: dict[int, int] = {
    ev.MARIADB_COMPRESSED_QUERY: ev.QUERY,
    166: ev.WRITE_ROWS_V1,
    167: ev.UPDATE_ROWS_V1,
    168: ev.DELETE_ROWS_V1,
    169: ev.WRITE_ROWS,
    170: ev.UPDATE_ROWS,
    171: ev.DELETE_ROWS,
}
#: Every event type `expand` unpacks.
COMPRESSED = frozenset(MARIADB_PLAIN) | {ev.TRANSACTION_PAYLOAD}

_HEADER = 19  # the common header of an event
_ZLIB = 0
_ZSTD, _NONE = 0, 255
_PAYLOAD_SIZE, _COMPRESSION, _UNCOMPRESSED_SIZE = 1, 2, 3
#: Refuse to inflate a MariaDB event past this (its length field allows 4 GiB).
_MAX_EVENT = 1 << 30


class CorruptEvent(RunFailed):
    """A compressed event that does not decode."""


def expand(packet: bytes, fmt: ev.Format, kind: int, where: str) -> list[bytes]:
    """The plain events a compressed event stands for, as stream packets.

    Args:
        packet: the compressed event's stream packet.
        fmt: the format description of its binlog file.
        kind: its event type (one of `COMPRESSED`).
        where: its ``file:position``, for errors.

    Raises:
        CorruptEvent: the event is truncated, corrupt or of an unknown algorithm.
    """
    try:
        if kind == ev.TRANSACTION_PAYLOAD:
            return mysql_payload(packet, fmt, where)
        return [mariadb_event(packet, fmt, kind, where)]
    except CorruptEvent:
        raise
    except (ValueError, IndexError, struct.error, zlib.error, zstandard.ZstdError) as exc:
        raise _corrupt(where, kind, str(exc) or type(exc).__name__) from exc


def _corrupt(where: str, kind: int, what: str) -> CorruptEvent:
    name = (
        "compressed transaction payload" if kind == ev.TRANSACTION_PAYLOAD else "compressed event"
    )
    return CorruptEvent(
        f"{where} holds a {name} (type {kind}) that does not decode: {what}. "
        "The binlog is damaged or was written by a server this Tidemark does "
        "not understand; check it with mysqlbinlog/mariadb-binlog "
        "--verbose, and re-snapshot the run's tables from after it"
    )


# --------------------------------------------------------------------------- MariaDB


def mariadb_event(packet: bytes, fmt: ev.Format, kind: int, where: str) -> bytes:
    """A MariaDB compressed QUERY or rows event as the plain event."""
    plain = MARIADB_PLAIN[kind]
    if plain == ev.QUERY:
        post = fmt.post_header(kind, 13)
        status_length = int.from_bytes(packet[ev.BODY + 11 : ev.BODY + 13], "little")
        start = ev.BODY + post + status_length + packet[ev.BODY + 8] + 1  # ... database, NUL
    else:
        start = ev.rows_layout(packet, fmt, plain).start
    end = fmt.end(packet)
    if start > end:
        raise _corrupt(where, kind, "the event ends before its compressed part")
    inflated = inflate_mariadb(bytes(packet[start:end]), where, kind)
    return _packet(packet[:start], plain, None, inflated, fmt)


def inflate_mariadb(data: bytes, where: str, kind: int) -> bytes:
    """MariaDB's compressed block: header byte, big-endian length, zlib stream.

    >>> inflate_mariadb(bytes([0x81, 3]) + zlib.compress(b"abc"), "f:4", 165)
    b'abc'
    """
    if not data:
        raise _corrupt(where, kind, "the compressed part is empty")
    flags = data[0]
    width, algorithm = flags & 0x07, (flags >> 4) & 0x07
    if not flags & 0x80 or not 1 <= width <= 4:
        raise _corrupt(where, kind, f"bad compression header byte 0x{flags:02x}")
    if algorithm != _ZLIB:
        raise _corrupt(
            where, kind, f"unknown compression algorithm {algorithm} (only zlib, 0, is known)"
        )
    if len(data) < 1 + width:
        raise _corrupt(where, kind, "the event ends inside the uncompressed length")
    length = int.from_bytes(data[1 : 1 + width], "big")
    if length > _MAX_EVENT:
        raise _corrupt(where, kind, f"an uncompressed length of {length} bytes")
    inflater = zlib.decompressobj()
    out = inflater.decompress(data[1 + width :], length + 1)
    if not inflater.eof:
        raise _corrupt(
            where, kind, f"the zlib stream is truncated or longer than its stated {length} bytes"
        )
    if len(out) != length or inflater.unused_data:
        raise _corrupt(
            where,
            kind,
            f"{len(out)} bytes inflated where {length} were stated"
            if len(out) != length
            else "bytes after the end of the zlib stream",
        )
    return out


# --------------------------------------------------------------------------- MySQL


def mysql_payload(packet: bytes, fmt: ev.Format, where: str) -> list[bytes]:
    """A MySQL TRANSACTION_PAYLOAD event as the events it holds, each with the payload's
    end as its next position."""
    kind = ev.TRANSACTION_PAYLOAD
    pos, end = ev.BODY + fmt.post_header(kind, 0), fmt.end(packet)
    fields: dict[int, int] = {}
    while True:
        if pos >= end:
            raise _corrupt(where, kind, "the payload header has no end mark")
        field, pos = ev.lenenc(packet, pos)
        if field == 0:
            break
        length, pos = ev.lenenc(packet, pos)
        if field in (_PAYLOAD_SIZE, _COMPRESSION, _UNCOMPRESSED_SIZE):
            fields[field], pos = ev.lenenc(packet, pos)
        else:  # a field this version does not know: skip its value
            pos += length
    if _PAYLOAD_SIZE not in fields or _COMPRESSION not in fields:
        raise _corrupt(
            where, kind, "the payload header lacks the payload size or the compression type"
        )
    size = fields[_PAYLOAD_SIZE]
    if pos + size > end:
        raise _corrupt(
            where, kind, f"a payload of {size} bytes but {max(end - pos, 0)} in the event"
        )
    payload = bytes(packet[pos : pos + size])
    match fields[_COMPRESSION]:
        case 0:
            raw = _unzstd(payload, fields.get(_UNCOMPRESSED_SIZE), where)
        case 255:
            raw = payload
        case other:
            raise _corrupt(where, kind, f"unknown compression type {other} (0 is zstd, 255 none)")
    _, next_position = ev.header(packet)
    return [
        _packet(b"\x00" + event[:_HEADER], None, next_position, event[_HEADER:], fmt)
        for event in _split(raw, where)
    ]


def _unzstd(payload: bytes, stated: int | None, where: str) -> bytes:
    """The zstd frames of a payload, no more than the stated size (a bomb is an error)."""
    limit = stated if stated is not None else _MAX_EVENT
    reader = zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=True)
    parts: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = reader.read(min(limit + 1 - total, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    if total > limit or (stated is not None and total != stated):
        raise _corrupt(
            where,
            ev.TRANSACTION_PAYLOAD,
            f"{'more than ' if total > limit else ''}{total} bytes decompressed where "
            f"{limit} were stated",
        )
    return b"".join(parts)


def _split(raw: bytes, where: str) -> list[bytes]:
    """The events of an uncompressed payload (their sizes must tile it exactly)."""
    events, pos = [], 0
    while pos < len(raw):
        if len(raw) - pos < _HEADER:
            raise _corrupt(where, ev.TRANSACTION_PAYLOAD, "the payload ends inside an event header")
        kind = raw[pos + 4]
        size = int.from_bytes(raw[pos + 9 : pos + 13], "little")
        if size < _HEADER or pos + size > len(raw):
            raise _corrupt(
                where,
                ev.TRANSACTION_PAYLOAD,
                f"an event of type {kind} at offset {pos} of the payload claims "
                f"{size} bytes, {len(raw) - pos} are left",
            )
        if kind in COMPRESSED or kind in (ev.FORMAT_DESCRIPTION, ev.ROTATE):
            raise _corrupt(
                where, ev.TRANSACTION_PAYLOAD, f"an event of type {kind} inside the payload"
            )
        events.append(raw[pos : pos + size])
        pos += size
    if not events:
        raise _corrupt(where, ev.TRANSACTION_PAYLOAD, "the payload holds no event")
    return events


# --------------------------------------------------------------------------- packets


def _packet(
    head: bytes, kind: int | None, next_position: int | None, body: bytes, fmt: ev.Format
) -> bytes:
    """A stream packet from the start of one (the 0x00 byte, the header, maybe more) and the
    rest of its body: type and next position replaced when given, size set, checksum as
    ``fmt`` says."""
    start = bytearray(head)
    if kind is not None:
        start[5] = kind
    if next_position is not None:
        start[14:18] = next_position.to_bytes(4, "little")
    event = start + body
    size = len(event) - 1 + fmt.checksum
    event[10:14] = size.to_bytes(4, "little")
    if fmt.checksum:
        event += zlib.crc32(event[1:]).to_bytes(4, "little")
    return bytes(event)
