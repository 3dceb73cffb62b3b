"""Text comparison in a column's collation, for `orchestrator.schema.filters`.

UTF-8 ``_bin`` collations order by code point (PAD SPACE unless ``nopad``): compared here.
Every other collation's case, accent and pad rules are the server's own, so those
comparisons go to a `CollationOracle` (`orchestrator.pipeline.capture.filtering.ServerCollation`).
"""

from __future__ import annotations

import re
from typing import Protocol

from orchestrator.schema.tables import ColumnInfo

_LOCAL_CHARSETS = ("utf8mb4", "utf8mb3", "utf8", "ascii")


class FilterError(ValueError):
    """A filter (or a part of it) the change rows cannot be evaluated on exactly."""


class CollationOracle(Protocol):
    """Text comparison in a collation, answered by the server (cached by the implementer)."""

    def compare(self, column: ColumnInfo, a: str, b: str) -> int: ...

    def like(self, column: ColumnInfo, value: str, pattern: str, escape: str) -> bool: ...


def local_collation(column: ColumnInfo) -> bool:
    """Text whose collation is code-point order (UTF-8 ``_bin``): compared here."""
    collation = column.collation or ""
    return (column.charset or "") in _LOCAL_CHARSETS and collation.endswith("_bin")


def like_regex(pattern: str, escape: str) -> str:
    r"""A LIKE pattern as a regular expression (``%`` any run, ``_`` one character).

    >>> like_regex("a_!%%", "!")
    'a.%.*'
    """
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return "".join(out)


def pad_compare(a: str, b: str) -> int:
    """PAD SPACE: the shorter string compares as if padded with spaces."""
    width = max(len(a), len(b))
    return (a.ljust(width) > b.ljust(width)) - (a.ljust(width) < b.ljust(width))


class NoOracle:
    """No server at hand: a comparison that needs one is refused."""

    def compare(self, column: ColumnInfo, a: str, b: str) -> int:
        raise FilterError(
            f"column `{column.name}`: comparing {column.collation} text needs the source server"
        )

    def like(self, column: ColumnInfo, value: str, pattern: str, escape: str) -> bool:
        return self.compare(column, value, pattern) == 0
