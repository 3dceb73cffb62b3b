"""GTID sets (orchestrator.binlog.gtid): text forms, MySQL's binary form checked against
python-mysql-replication's encoder, the tracker fed real-shaped GTID events, and the dump
command a MySQL GTID stream sends."""

from __future__ import annotations

import random
import struct
import uuid
import zlib
from typing import Any

import pytest
from pymysqlreplication.gtid import GtidSet

from orchestrator.binlog import events as ev
from orchestrator.binlog.gtid import (
    GtidTracker,
    encode_mysql,
    format_mariadb,
    format_mysql,
    parse_mariadb,
    parse_mysql,
)
from orchestrator.binlog.stream import DumpStream


def random_mysql_set(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        sid = str(uuid.UUID(int=rng.getrandbits(128)))
        spans, at = [], rng.randint(1, 50)
        for _ in range(rng.randint(1, 5)):
            end = at + rng.randint(0, 30)
            spans.append(str(at) if end == at else f"{at}-{end}")
            at = end + rng.randint(2, 40)  # a gap: distinct intervals
        parts.append(f"{sid}:" + ":".join(spans))
    return ",".join(parts)


def test_mysql_sets_encode_as_python_mysql_replication_encodes_them() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        text = random_mysql_set(rng)
        ours, theirs = parse_mysql(text), GtidSet(text)
        assert parse_mysql(format_mysql(ours)) == ours == parse_mysql(str(theirs))
        # the library sends its sources in its own order; the server reads a set: compare per source
        assert encode_mysql(ours)[:8] == theirs.encoded()[:8]
        assert sorted(encode_mysql({sid: spans})[8:] for sid, spans in ours.items()) == sorted(
            g.encode() for g in theirs.gtids
        )


@pytest.mark.parametrize("bad", ["0-1", "a-1-2", "0-1-2,0-2-3"])
def test_bad_mariadb_positions_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_mariadb(bad)


@pytest.mark.parametrize("bad", ["not-a-uuid:1-5", "3e11fa47-71ca-11e1-9e33-c80aa9429562:tag:1-5"])
def test_bad_or_tagged_mysql_sets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_mysql(bad)


def packet(kind: int, server_id: int, body: bytes) -> bytes:
    """A stream packet: 0x00, the common header, the body, a CRC32."""
    size = 19 + len(body) + 4
    event = struct.pack("<IBIIIH", 0, kind, server_id, size, 1000, 0) + body
    return b"\x00" + event + struct.pack("<I", zlib.crc32(event))


def test_the_tracker_follows_mariadb_gtid_events() -> None:
    tracker = GtidTracker("mariadb", "0-1-100,1-2-7")
    tracker.seen(packet(ev.MARIADB_GTID, 1, struct.pack("<QIB", 101, 0, 0)))
    tracker.seen(packet(ev.MARIADB_GTID, 3, struct.pack("<QIB", 5, 2, 1)))  # a new domain
    tracker.seen(packet(ev.MARIADB_GTID, 4, struct.pack("<QIB", 102, 0, 0)))  # after a failover
    assert tracker.text == "0-4-102,1-2-7,2-3-5"
    assert format_mariadb(parse_mariadb(tracker.text)) == tracker.text
    unknown = GtidTracker("mariadb", None)
    unknown.seen(packet(ev.MARIADB_GTID, 1, struct.pack("<QIB", 101, 0, 0)))
    assert unknown.text is None  # where it began is unknown: so is every later set


def test_the_tracker_follows_mysql_gtid_events() -> None:
    sid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    tracker = GtidTracker("mysql", f"{sid}:1-5:9")
    for number in (6, 7, 8, 10):
        tracker.seen(
            packet(ev.MYSQL_GTID, 1, b"\x01" + uuid.UUID(sid).bytes + struct.pack("<Q", number))
        )
    other = uuid.UUID(int=7)
    tracker.seen(packet(ev.MYSQL_GTID, 1, b"\x01" + other.bytes + struct.pack("<Q", 1)))
    assert tracker.text == f"00000000-0000-0000-0000-000000000007:1,{sid}:1-10"


class _Server:
    """What DumpStream.open needs of a connection: cursor, server info, bytes written."""

    def __init__(self, version: str) -> None:
        self.version, self.sent, self.statements = version, b"", []
        self._next_seq_id = 0

    def get_server_info(self) -> str:
        return self.version

    def cursor(self) -> Any:
        server = self

        class Cursor:
            def __enter__(self) -> Cursor:
                return self

            def __exit__(self, *_: object) -> None:
                pass

            def execute(self, sql: str, args: Any = None) -> None:
                server.statements.append(sql if args is None else f"{sql} {args!r}")

        return Cursor()

    def _write_bytes(self, data: bytes) -> None:
        self.sent += data


def test_a_gtid_stream_asks_as_a_gtid_replica() -> None:
    """MySQL: COM_BINLOG_DUMP_GTID with the encoded set; MariaDB: the connect state, strict
    mode, and a dump without a file. (No MySQL server here: the command's layout is checked
    against the protocol's fields.)"""
    sid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    mysql = _Server("8.0.36")
    stream = DumpStream(lambda **_: mysql, {}, 54001, "", 4, "db:3306", gtid=f"{sid}:1-5")  # type: ignore[arg-type]
    stream.open()
    body = mysql.sent[4:]
    command, flags, server_id, name_length, position, size = struct.unpack_from("<BHIIQI", body)
    assert (command, flags, server_id, name_length, position) == (0x1E, 0x05, 54001, 0, 4)
    fixed = struct.calcsize("<BHIIQI")
    assert body[fixed:] == GtidSet(f"{sid}:1-5").encoded() and size == len(body) - fixed
    assert not [s for s in mysql.statements if "slave_connect_state" in s]
    maria = _Server("10.11.6-MariaDB")
    DumpStream(lambda **_: maria, {}, 54001, "", 4, "db:3306", gtid="0-1-9").open()  # type: ignore[arg-type]
    assert "SET @slave_connect_state = %s ('0-1-9',)" in maria.statements
    assert "SET @slave_gtid_strict_mode = 1" in maria.statements
    assert maria.sent[4:] == struct.pack("<BIHI", 0x12, 4, 0x01, 54001)
