"""The cascade graph of a run, at plan (docs/design.md, "Foreign-key cascades").

For every table of the run: the cascading foreign keys that can change its rows
(`orchestrator.schema.cascades.closure`: those it is the child of and, recursively, those of
their parents), each with why a cascade through it is re-read rather than derived, and the shape
of every parent that is not a table of the run (its row events are captured, never
published). Recorded in the table's run info as ``cascades``, so that the capture, a resumed
one included, works from what was planned; `doctor` and ``plan --json`` show the same.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.config import PipelineConfig
from orchestrator.schema.cascades import ForeignKey, Mode, closure, with_reasons
from orchestrator.schema.tables import TableInfo, table_info_from_json, table_info_to_json
from orchestrator.source.connection import Source
from orchestrator.source.foreign_keys import cascade_mode, cascading_keys
from orchestrator.source.listing import tables_info

log = logging.getLogger("tidemark.planning")


def table_cascades(
    config: PipelineConfig,
    source: Source,
    planned: Iterable[str],
    known: Mapping[str, TableInfo] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{table: cascades}`` for each of ``planned`` (tables of the run): the ``cascades`` entry of
    its run info (`CascadeInfo.to_json`); tables no cascading key can change are left out.

    Args:
        config: the pipeline (the tables' ``where`` filters).
        source: the source.
        planned: the tables being planned now.
        known: shapes already read, by name.
    """
    mode = cascade_mode(source)
    planned = list(planned)
    if mode == "logged":
        log.info("the source logs the rows its foreign-key cascades change: nothing to derive")
        return {t: CascadeInfo("logged").to_json() for t in planned}
    everything = cascading_keys(source, planned)
    per_table = {t: closure([t], everything) for t in planned}
    named = {n for keys in per_table.values() for k in keys for n in (k.child, k.parent)}
    infos = {n.lower(): i for n, i in (known or {}).items()}
    missing = [n for n in named if n.lower() not in infos]
    infos |= {n.lower(): i for n, i in tables_info(source, missing).items()}
    filtered = _filter_columns(config, named)
    out = {}
    for table, keys in per_table.items():
        if not keys:
            continue
        reasoned = with_reasons(keys, infos, filtered)
        outside = {  # every table the keys name: one of the run may fail, and be read as a parent
            name: infos[name.lower()]
            for k in reasoned
            for name in (k.parent, k.child)
            if name.lower() != table.lower() and name.lower() in infos
        }
        unknown = sorted(
            {n for k in reasoned for n in (k.parent, k.child) if n.lower() not in infos}
            | {k.parent for k in reasoned if k.hidden}
        )
        blocked = (
            f"table {table}: foreign-key cascades from {', '.join(unknown)} can change its rows, "
            f"but the source user cannot see the columns or the keys' rules of "
            f"{', '.join(unknown)}: grant it SELECT there (their row events are decoded to follow "
            f"the cascades), or leave {table} out"
            if unknown
            else None
        )
        out[table] = CascadeInfo(mode, tuple(reasoned), outside, blocked).to_json()
        for key in reasoned:
            log.info(
                "table %s: cascading key %s: %s",
                table,
                key,
                "derived" if key.rereads is None else f"re-read ({key.rereads})",
            )
    return out


def _filter_columns(config: PipelineConfig, tables: Iterable[str]) -> dict[str, set[str]]:
    """The columns each table's ``where`` filter reads (lower case), for tables that have one."""
    out = {}
    for table in tables:
        where = config.table_where(table)
        if where:
            from orchestrator.schema.filters import used_columns  # sqlglot: only with a filter

            out[table.lower()] = {c.lower() for c in used_columns(where)}
    return out


class CascadeInfo:
    """A run table's ``cascades`` run info.

    Attributes:
        mode: `orchestrator.schema.cascades.Mode`.
        keys: the cascading keys that can change its rows (empty when ``logged``).
        outside: the shape of each other table those keys name (a parent outside the run is read
            for the cascades only; so is one of the run that failed).
        blocked: why the cascades cannot be followed at all (a table they name whose columns
            the source user cannot see), with the fix; the table is not planned.
    """

    def __init__(
        self,
        mode: Mode,
        keys: tuple[ForeignKey, ...] = (),
        outside: Mapping[str, TableInfo] | None = None,
        blocked: str | None = None,
    ) -> None:
        self.mode = mode
        self.keys = keys
        self.outside = dict(outside or {})
        self.blocked = blocked

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "keys": [k.to_json() for k in self.keys],
            "outside": {n: table_info_to_json(i) for n, i in self.outside.items()},
            "blocked": self.blocked,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> CascadeInfo | None:
        if not data:
            return None
        return cls(
            data["mode"],
            tuple(ForeignKey.from_json(k) for k in data.get("keys", [])),
            {n: table_info_from_json(i) for n, i in data.get("outside", {}).items()},
            data.get("blocked"),
        )
