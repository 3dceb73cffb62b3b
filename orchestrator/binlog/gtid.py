"""GTID sets as text and as binlog events: MariaDB's GTID position and MySQL's GTID set.

A position's ``gtid_set`` says which transactions lie before it, in a form every server of a
replication topology understands (`orchestrator.binlog.failover` carries a position to
another server with it):

- MariaDB: the GTID *position*, the last GTID per replication domain, ``domain-server-seq``
  joined by commas (``0-1-100,1-2-7``): what ``BINLOG_GTID_POS`` and ``@@gtid_binlog_pos``
  return and ``@slave_connect_state`` takes. Sequence numbers grow within a domain.
- MySQL: the executed GTID *set*, ``uuid:1-100:105,uuid2:1-7`` (``Executed_Gtid_Set``), sent
  to ``COM_BINLOG_DUMP_GTID`` as right-open intervals.

`GtidTracker` keeps the set up to date from the GTID events of a stream, so a position the
stream reaches carries the exact set there.
"""

from __future__ import annotations

import re
import struct
import uuid
from typing import Literal

from orchestrator.binlog import events as ev

Flavor = Literal["mariadb", "mysql"]

#: MariaDB: domain -> (server_id, seq_no) of its last GTID.
MariaState = dict[int, tuple[int, int]]
#: MySQL: source uuid (lower case) -> sorted, disjoint right-open intervals of transaction numbers.
MysqlSet = dict[str, list[tuple[int, int]]]

_MARIA_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MYSQL_INTERVAL = re.compile(r"^(\d+)(?:-(\d+))?$")


# --------------------------------------------------------------------------- MariaDB


def parse_mariadb(text: str | None) -> MariaState:
    """A MariaDB GTID position.

    >>> parse_mariadb("0-1-100, 1-2-7")
    {0: (1, 100), 1: (2, 7)}
    >>> parse_mariadb("")
    {}
    """
    state: MariaState = {}
    for part in (text or "").replace("\n", "").split(","):
        if not part.strip():
            continue
        match = _MARIA_GTID.match(part.strip())
        if match is None:
            raise ValueError(f"not a MariaDB GTID: {part.strip()!r}")
        domain, server, seq = (int(g) for g in match.groups())
        if domain in state:
            raise ValueError(f"MariaDB GTID position {text!r} names domain {domain} twice")
        state[domain] = (server, seq)
    return state


def format_mariadb(state: MariaState) -> str:
    """The text form, domains in order.

    >>> format_mariadb({1: (2, 7), 0: (1, 100)})
    '0-1-100,1-2-7'
    """
    return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(state.items()))


def mariadb_covers(wanted: MariaState, state: MariaState) -> bool:
    """Whether every transaction before a binlog point whose GTID position is ``state`` is
    in ``wanted``: per domain, an earlier sequence number, or the very same GTID.

    >>> mariadb_covers({0: (1, 100)}, {0: (1, 90)}), mariadb_covers({0: (1, 100)}, {0: (1, 100)})
    (True, True)
    >>> mariadb_covers({0: (1, 100)}, {0: (2, 100)})  # another server's 100th: diverged
    False
    >>> mariadb_covers({0: (1, 100)}, {0: (1, 100), 1: (3, 1)})  # a domain it never saw
    False
    """
    for domain, (server, seq) in state.items():
        if domain not in wanted:
            return False
        wanted_server, wanted_seq = wanted[domain]
        if seq > wanted_seq or (seq == wanted_seq and server != wanted_server):
            return False
    return True


# --------------------------------------------------------------------------- MySQL


def parse_mysql(text: str | None) -> MysqlSet:
    """A MySQL GTID set; intervals merged. Tagged GTIDs (MySQL 8.3+) are refused.

    >>> parse_mysql("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:7,"
    ...             " 3e11fa47-71ca-11e1-9e33-c80aa9429562:6")
    {'3e11fa47-71ca-11e1-9e33-c80aa9429562': [(1, 8)]}
    """
    found: MysqlSet = {}
    for part in (text or "").replace("\n", "").split(","):
        part = part.strip()
        if not part:
            continue
        sid, *intervals = part.split(":")
        try:
            name = str(uuid.UUID(sid))
        except ValueError as exc:
            raise ValueError(f"not a MySQL GTID set member: {part!r}") from exc
        for interval in intervals:
            match = _MYSQL_INTERVAL.match(interval)
            if match is None:
                raise ValueError(
                    f"MySQL GTID {part!r}: {interval!r} is not an interval (tagged "
                    "GTIDs are not supported)"
                )
            first = int(match.group(1))
            _add_interval(found.setdefault(name, []), first, int(match.group(2) or first) + 1)
    return found


def _add_interval(intervals: list[tuple[int, int]], start: int, end: int) -> None:
    """Add the right-open ``[start, end)`` to sorted disjoint intervals, merging touching ones."""
    merged = []
    for a, b in intervals:
        if b < start or a > end:
            merged.append((a, b))
        else:
            start, end = min(a, start), max(b, end)
    merged.append((start, end))
    intervals[:] = sorted(merged)


def format_mysql(gtids: MysqlSet) -> str:
    """The text form (``uuid:1-5:7``), sources in order.

    >>> format_mysql({"3e11fa47-71ca-11e1-9e33-c80aa9429562": [(1, 6), (7, 8)]})
    '3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:7'
    """

    def interval(a: int, b: int) -> str:
        return str(a) if b == a + 1 else f"{a}-{b - 1}"

    return ",".join(
        f"{sid}:" + ":".join(interval(a, b) for a, b in spans)
        for sid, spans in sorted(gtids.items())
        if spans
    )


def encode_mysql(gtids: MysqlSet) -> bytes:
    """The binary form ``COM_BINLOG_DUMP_GTID`` takes: the number of sources (u64), then per
    source its 16 uuid bytes, the number of intervals (u64) and each as start, end (u64,
    right-open), all little-endian.

    >>> encode_mysql({"3e11fa47-71ca-11e1-9e33-c80aa9429562": [(1, 6)]}).hex()[:16]
    '0100000000000000'
    """
    out = [struct.pack("<Q", len(gtids))]
    for sid, spans in sorted(gtids.items()):
        out.append(uuid.UUID(sid).bytes + struct.pack("<Q", len(spans)))
        out.extend(struct.pack("<QQ", a, b) for a, b in spans)
    return b"".join(out)


# --------------------------------------------------------------------------- both


def same_set(a: str | None, b: str | None, flavor: Flavor) -> bool:
    """Whether two GTID texts name the same set (spacing, case and order aside).

    >>> same_set("0-1-5,1-1-2", "1-1-2, 0-1-5", "mariadb"), same_set("0-1-5", "0-1-6", "mariadb")
    (True, False)
    """
    if flavor == "mariadb":
        return parse_mariadb(a) == parse_mariadb(b)
    return parse_mysql(a) == parse_mysql(b)


class GtidTracker:
    """The GTID set at the current point of a binlog stream, from the set where it began and
    each GTID event since (the set at a transaction boundary is then exact).

    Args:
        flavor: the server's (MariaDB: last GTID per domain; MySQL: every executed GTID).
        start: the set where the stream began; None when unknown (`text` stays None).
    """

    def __init__(self, flavor: Flavor, start: str | None) -> None:
        self.flavor = flavor
        self.known = start is not None
        self._maria = parse_mariadb(start) if flavor == "mariadb" else {}
        self._mysql = parse_mysql(start) if flavor == "mysql" else {}

    def seen(self, packet: bytes) -> None:
        """A GTID event: MariaDB's (seq_no u64, domain u32; the server in the event header)
        or MySQL's (flags u8, source uuid 16 bytes, transaction number u64)."""
        kind = packet[5]
        if kind == ev.MARIADB_GTID:
            seq, domain = struct.unpack_from("<QI", packet, ev.BODY)
            server = struct.unpack_from("<I", packet, 6)[0]
            self._maria[domain] = (server, seq)
        elif kind == ev.MYSQL_GTID:
            sid = str(uuid.UUID(bytes=bytes(packet[ev.BODY + 1 : ev.BODY + 17])))
            number = struct.unpack_from("<Q", packet, ev.BODY + 17)[0]
            _add_interval(self._mysql.setdefault(sid, []), number, number + 1)

    @property
    def text(self) -> str | None:
        """The set now, in the server's text form; None if where the stream began was unknown."""
        if not self.known:
            return None
        return (
            format_mariadb(self._maria) if self.flavor == "mariadb" else format_mysql(self._mysql)
        ) or None
