"""Binlog positions: where in the source's change history a thing happened."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

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
class BinlogPosition:
    """A point in the binlog: file, byte offset of an event, and row within the event.

    Positions order by (file index, offset, row), which is the order the server
    wrote them. ``gtid_set`` is carried along when GTIDs are on; it does not take
    part in the ordering.

    >>> a = BinlogPosition("binlog.000002", 400)
    >>> b = BinlogPosition("binlog.000010", 4)
    >>> a < b
    True
    >>> BinlogPosition("binlog.000002", 400, 3) > a
    True
    """

    file: str
    pos: int
    row: int = 0
    gtid_set: str | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[int, int, int]:
        return (file_index(self.file), self.pos, self.row)

    def __lt__(self, other: BinlogPosition) -> bool:
        return self.key < other.key

    def __le__(self, other: BinlogPosition) -> bool:
        return self.key <= other.key

    def __gt__(self, other: BinlogPosition) -> bool:
        return self.key > other.key

    def __ge__(self, other: BinlogPosition) -> bool:
        return self.key >= other.key

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "row": self.row, "gtid_set": self.gtid_set}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BinlogPosition:
        return cls(data["file"], int(data["pos"]), int(data.get("row", 0)), data.get("gtid_set"))

    def __str__(self) -> str:
        return f"{self.file}:{self.pos}" + (f"#{self.row}" if self.row else "")
