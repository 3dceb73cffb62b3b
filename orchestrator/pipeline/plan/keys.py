"""Which columns a table is chunked on: the one rule `plan` and `doctor` share.

A configured ``chunk_key`` must be the primary key or a unique NOT NULL key,
with its columns in index order; without one, the primary key is used. A table with
neither a primary key nor a unique NOT NULL key has no chunk key (``()``): it is published as
the multiset of its rows (`orchestrator.pipeline.keyless`).
"""

from __future__ import annotations

import functools
import itertools
import re
import zoneinfo
from collections.abc import Sequence
from datetime import UTC, datetime

from chunking.mysql import unsupported_key_reason
from orchestrator.config import TableConfig
from orchestrator.errors import ConfigError, SourceNotReady
from orchestrator.schema.tables import TableInfo

_OFFSET = re.compile(r"[+-]\d{1,2}:\d{2}")


@functools.lru_cache(maxsize=16)
def repeats_local_times(zone: str) -> bool:
    """Whether MySQL time zone ``zone`` sets clocks back between 1970 and 2038 (TIMESTAMP's
    range), so that some local times name two instants. A name Python does not know, and
    ``SYSTEM`` (the server's own zone), count as doing so.

    >>> (repeats_local_times("+02:00"), repeats_local_times("UTC"),
    ...  repeats_local_times("Europe/Berlin"))
    (False, False, True)
    """
    if _OFFSET.fullmatch(zone):
        return False
    try:
        tz = zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return True
    offsets = [
        datetime(year, month, 1, tzinfo=UTC).astimezone(tz).utcoffset()
        for year in range(1970, 2039)
        for month in range(1, 13)
    ]
    return any(b < a for a, b in itertools.pairwise(offsets) if a is not None and b is not None)


def _names(key: Sequence[str]) -> str:
    return "[" + ", ".join(key) + "]"


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    return [c.lower() for c in a] == [c.lower() for c in b]


def _configured_key(table_config: TableConfig, info: TableInfo) -> tuple[str, ...]:
    wanted = table_config.chunk_key or ()
    names = {c.name.lower(): c.name for c in info.columns}
    missing = [c for c in wanted if c.lower() not in names]
    if missing:
        raise ConfigError(
            f"table `{info.name}`: chunk_key column(s) {', '.join(missing)} do not exist; "
            f"columns are {', '.join(c.name for c in info.columns)}"
        )
    key = tuple(names[c.lower()] for c in wanted)
    candidates = ([info.primary_key] if info.primary_key else []) + list(info.unique_not_null_keys)
    for candidate in candidates:
        if _same(key, candidate):
            return tuple(candidate)
    for candidate in candidates:
        if sorted(c.lower() for c in key) == sorted(c.lower() for c in candidate):
            raise ConfigError(
                f"table `{info.name}`: chunk_key {_names(key)} must list the key's columns in "
                f"index order: chunk_key: {_names(candidate)}"
            )
    usable = ", ".join(_names(c) for c in candidates) or "none"
    raise ConfigError(
        f"table `{info.name}`: chunk_key {_names(key)} is not the primary key or a unique "
        f"NOT NULL key, so chunks could share rows; use one of: {usable} "
        f"(or add one: ALTER TABLE {info.name} ADD UNIQUE KEY ({', '.join(key)}) "
        "with the columns NOT NULL)"
    )


def choose_chunk_key(
    table_config: TableConfig, table_info: TableInfo, time_zone: str = "+00:00"
) -> tuple[str, ...]:
    """The columns a table is chunked on: the configured ``chunk_key``, else the primary key;
    ``()`` for a table without a primary key or a unique NOT NULL key (it is read whole and
    published as the multiset of its rows: `orchestrator.pipeline.keyless`).

    A configured key must be the primary key or a unique NOT NULL key, columns in
    index order (so each index walk reads the index in order). A TIMESTAMP column is refused
    in a key when the session's ``time_zone`` (``source.time_zone``) sets clocks back: chunk
    bounds are written as local times, and one in the repeated hour reads back as the other
    instant, so the last chunk's ``<= max`` or an index walk missed rows.

    Raises:
        ConfigError: the configured key is not usable, or the table has no primary
            key but a unique NOT NULL key to configure.
        SourceNotReady: the table's key's type cannot be chunked.
    """
    info = table_info
    if table_config.chunk_key:
        key = _configured_key(table_config, info)
    elif info.primary_key:
        key = tuple(info.primary_key)
    elif info.unique_not_null_keys:
        options = " or ".join(f"chunk_key: {_names(k)}" for k in info.unique_not_null_keys)
        raise ConfigError(
            f"table `{info.name}` has no primary key; set {options} for it in the config "
            "(a unique NOT NULL key, so every row falls in exactly one chunk)"
        )
    else:
        return ()
    for name in key:
        column = info.column(name)
        reason = unsupported_key_reason(column.data_type, column.collation)
        if reason is None and column.data_type == "year" and column.display_width == 2:
            # its bounds read as two digits (90 for 1990) and compare so: ranges missed rows
            reason = "YEAR(2) reads as two digits that compare out of its order; ALTER it to YEAR"
        if reason is None and column.data_type == "timestamp" and repeats_local_times(time_zone):
            reason = (
                f"it is a TIMESTAMP, and source.time_zone {time_zone!r} sets clocks back (daylight "
                "saving time), so a bound in the repeated hour names two instants and chunks could "
                "miss rows; set source.time_zone to an offset such as +00:00 (TIMESTAMP values are "
                "published in UTC either way)"
            )
        if reason:
            message = f"table `{info.name}`: chunk-key column `{name}` cannot be chunked: {reason}"
            others = [k for k in info.unique_not_null_keys if not _same(k, key)]
            if others:
                message += f"; try chunk_key: {_names(others[0])}"
            raise (ConfigError(message) if table_config.chunk_key else SourceNotReady(message))
    return key
