"""Binlog positions: where in the source's change history a thing happened, and on which server.

A file offset means something only in the binlog of the server that wrote it: a replica's
``binlog.000003:1234`` and its primary's are unrelated places. So a position carries the
identity of its server (``server_id``; MySQL's ``server_uuid`` too) and the GTID set at that
point, which *is* portable across a replication topology. Ordering two positions of different
servers by offset is refused (`SourceChanged`); `orchestrator.binlog.failover` carries a
position to another server by its GTID set.

May import: errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.errors import SourceChanged

_SUFFIX = re.compile(r"\.(\d+)$")


def file_index(name: str) -> int:
    """The numeric suffix of a binlog file name.

    >>> file_index("binlog.000007")
    7
    >>> file_index("mysql-bin.123456")
    123456
    """
    match = _SUFFIX.search(name)
    if not match:
        raise ValueError(f"not a binlog file name: {name!r}")
    return int(match.group(1))


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """Which server wrote a binlog: ``@@server_id``, and ``@@server_uuid`` on MySQL (None on
    MariaDB).

    >>> str(ServerIdentity(2)), str(ServerIdentity(7, "3e11fa47-71ca-11e1-9e33-c80aa9429562"))
    ('server_id 2', 'server 3e11fa47-71ca-11e1-9e33-c80aa9429562 (server_id 7)')
    """

    server_id: int
    server_uuid: str | None = None

    def wrote(self, position: BinlogPosition) -> bool | None:
        """Whether ``position`` was recorded on this server; None when it does not say
        (recorded before positions carried their server).

        >>> ServerIdentity(2).wrote(BinlogPosition("b.000001", 4, server_id=2))
        True
        >>> (ServerIdentity(2).wrote(BinlogPosition("b.000001", 4, server_id=1)),
        ...  ServerIdentity(2).wrote(BinlogPosition("b.000001", 4)))
        (False, None)
        """
        if position.server_id is None and position.server_uuid is None:
            return None
        if position.server_uuid is not None and self.server_uuid is not None:
            return position.server_uuid.lower() == self.server_uuid.lower()
        return position.server_id == self.server_id

    def __str__(self) -> str:
        if self.server_uuid:
            return f"server {self.server_uuid} (server_id {self.server_id})"
        return f"server_id {self.server_id}"


@dataclass(frozen=True, slots=True)
class BinlogPosition:
    """A point in one server's binlog: file, byte offset of an event, and row within the event.

    Positions of one server order by (file index, offset, row), the order it wrote them.
    ``gtid_set`` (MariaDB's GTID position or MySQL's executed GTID set at that point),
    ``server_id`` and ``server_uuid`` (MySQL) are carried along and do not take part in the
    ordering; ordering positions of two different servers raises `SourceChanged`.

    >>> a = BinlogPosition("binlog.000002", 400)
    >>> b = BinlogPosition("binlog.000010", 4)
    >>> a < b
    True
    >>> BinlogPosition("binlog.000002", 400, 3) > a
    True
    >>> try:
    ...     BinlogPosition("binlog.000002", 400, server_id=1) < BinlogPosition(
    ...         "binlog.000010", 4, server_id=2)
    ... except SourceChanged as e:
    ...     print(type(e).__module__, type(e).__name__, str(e) == (
    ...         "positions of two servers cannot be ordered by binlog offset: binlog.000002:400"
    ...         " (server_id 1) and binlog.000010:4 (server_id 2); the source changed during the"
    ...         " run: rerun `tidemark run`, which goes on from the published positions by GTID"))
    orchestrator.errors SourceChanged True
    """

    file: str
    pos: int
    row: int = 0
    gtid_set: str | None = field(default=None, compare=False)
    server_id: int | None = field(default=None, compare=False)
    server_uuid: str | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[int, int, int]:
        return (file_index(self.file), self.pos, self.row)

    @property
    def server(self) -> ServerIdentity | None:
        """The server it was recorded on; None for a position recorded before they said."""
        return None if self.server_id is None else ServerIdentity(self.server_id, self.server_uuid)

    def on(self, server: ServerIdentity, gtid_set: str | None) -> BinlogPosition:
        """The same place, stamped with the server that wrote it and the GTID set there."""
        return replace(
            self, server_id=server.server_id, server_uuid=server.server_uuid, gtid_set=gtid_set
        )

    def _ordered(self, other: BinlogPosition) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        server = self.server
        if server is not None and server.wrote(other) is False:
            raise SourceChanged(
                f"positions of two servers cannot be ordered by binlog offset: {self} ({server}) "
                f"and {other} ({other.server}); the source changed during the run: rerun "
                "`tidemark run`, which goes on from the published positions by GTID"
            )
        return self.key, other.key

    def __lt__(self, other: BinlogPosition) -> bool:
        mine, theirs = self._ordered(other)
        return mine < theirs

    def __le__(self, other: BinlogPosition) -> bool:
        mine, theirs = self._ordered(other)
        return mine <= theirs

    def __gt__(self, other: BinlogPosition) -> bool:
        mine, theirs = self._ordered(other)
        return mine > theirs

    def __ge__(self, other: BinlogPosition) -> bool:
        mine, theirs = self._ordered(other)
        return mine >= theirs

    def before(self, other: BinlogPosition) -> bool | None:
        """Whether this position comes before ``other`` in one server's binlog; None when they
        cannot be ordered by offset: not both recorded with their server, or two servers'.

        >>> a = BinlogPosition("b.000001", 4, server_id=1)
        >>> b = BinlogPosition("b.000002", 4, server_id=1)
        >>> a.before(b), b.before(a), a.before(BinlogPosition("b.000002", 4, server_id=2))
        (True, False, None)
        """
        server = self.server
        if server is None or server.wrote(other) is not True:
            return None
        return self.key < other.key

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "pos": self.pos,
            "row": self.row,
            "gtid_set": self.gtid_set,
            "server_id": self.server_id,
            "server_uuid": self.server_uuid,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BinlogPosition:
        """A position from `to_json`'s dict; one stored before a field existed lacks it (None).

        >>> p = BinlogPosition.from_json({"file": "b.000001", "pos": 4})
        >>> p  # doctest: +NORMALIZE_WHITESPACE
        BinlogPosition(file='b.000001', pos=4, row=0, gtid_set=None, server_id=None,
                       server_uuid=None)
        """
        server_id = data.get("server_id")
        return cls(
            data["file"],
            int(data["pos"]),
            int(data.get("row", 0)),
            data.get("gtid_set") or None,
            None if server_id is None else int(server_id),
            data.get("server_uuid") or None,
        )

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f"#{self.row}" if self.row else "")
