"""What `doctor` and ``plan`` say about foreign-key cascades (docs/operations.md, "Foreign-key
cascades"): whether the server logs the child rows its cascades change, and, for every cascading
key that can change a pipeline table's rows, what Tidemark does with it - derives its child-side
changes from the parent's row events, or re-reads the child when it cascades (and why) - and the
parents outside the pipeline whose row events are read for it. They inform; none fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.config import PipelineConfig
from orchestrator.pipeline.plan.cascades import CascadeInfo, table_cascades
from orchestrator.schema.cascades import ForeignKey
from orchestrator.source.check import Check
from orchestrator.source.connection import Source


def cascade_checks(config: PipelineConfig, source: Source, tables: Sequence[str]) -> list[Check]:
    """One line for the server's mode, and one per cascading key of ``tables``."""
    found = _cascades(config, source, tables)
    dialect = source.dialect
    if any(info.mode == "logged" for info in found.values()):
        return [
            Check(
                "foreign-key cascades",
                True,
                f"{dialect} runs foreign keys in the SQL layer and logs the rows its cascades "
                "change: applied as any row event, nothing derived",
            )
        ]
    keys = _unique(found.values())
    if not keys:
        return [Check("foreign-key cascades", True, "no cascading foreign key reaches the tables")]
    checks = [
        Check(
            "foreign-key cascades",
            True,
            f"{dialect} writes no row event for the child rows its cascades change: Tidemark "
            f"derives them from the parents' row events ({len(keys)} cascading key(s))",
        )
    ]
    in_pipeline = {t.lower() for t in tables}
    for key in keys:
        checks.append(Check(f"cascade {key.child}.{key.name}", True, describe(key, in_pipeline)))
    for table, info in found.items():
        if info.blocked:
            checks.append(Check(f"cascades {table}", False, info.blocked, "", tables=(table,)))
    return checks


def describe(key: ForeignKey, tables: set[str]) -> str:
    """What Tidemark does with ``key`` (``tables``: the pipeline's, lower case).

    >>> fk = ForeignKey("f", "s.c", ("p",), "s.p", ("id",), "CASCADE", "SET NULL")
    >>> describe(fk, {"s.c"})
    's.c (p) -> s.p (id) ON DELETE CASCADE ON UPDATE SET NULL: derived; s.p is not in the \
pipeline: its row events are read for the cascades, never published'
    """
    what = "derived" if key.rereads is None else f"re-read when it cascades ({key.rereads})"
    outside = [t for t in dict.fromkeys((key.parent, key.child)) if t.lower() not in tables]
    notes = "".join(
        f"; {t} is not in the pipeline: its row events are read for the cascades, never published"
        for t in outside
    )
    return f"{key}: {what}{notes}"


def plan_cascades(config: PipelineConfig, source: Source, tables: Sequence[str]) -> dict[str, Any]:
    """``plan --json``'s ``cascades`` (docs/cli.md): the server's mode and, per cascading key,
    the key, whether it is derived (else ``rereads`` says why not) and the tables it names that
    are not in the pipeline."""
    found = _cascades(config, source, tables)
    in_pipeline = {t.lower() for t in tables}
    mode = next((info.mode for info in found.values()), "derive")
    keys = [
        {
            **key.to_json(),
            "derived": key.rereads is None,
            "outside_pipeline": [
                t for t in dict.fromkeys((key.parent, key.child)) if t.lower() not in in_pipeline
            ],
        }
        for key in _unique(found.values())
    ]
    return {"mode": mode, "keys": keys}


def _cascades(
    config: PipelineConfig, source: Source, tables: Sequence[str]
) -> dict[str, CascadeInfo]:
    found = table_cascades(config, source, tables)
    return {t: i for t, data in found.items() if (i := CascadeInfo.from_json(data)) is not None}


def _unique(infos: Iterable[CascadeInfo]) -> list[ForeignKey]:
    keys: dict[tuple[str, str], ForeignKey] = {}
    for info in infos:
        for key in info.keys:
            keys.setdefault((key.child, key.name), key)
    return list(keys.values())
