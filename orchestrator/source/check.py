"""`Check`: the outcome of one preflight check, as `doctor` prints it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check.

    Attributes:
        name: what was checked, e.g. ``"binlog_format"`` or ``"chunk key shop.orders"``.
        ok: whether it passed.
        detail: what was found.
        fix: what to do about a failure ("" when passed).
        tables: the tables a failure concerns (empty: the whole source). A run goes on
            without tables that fail on their own (`orchestrator.pipeline.failed`).
    """

    name: str
    ok: bool
    detail: str
    fix: str = ""
    tables: tuple[str, ...] = ()

    def line(self) -> str:
        """One printable line: ``PASS name: detail`` or ``FAIL name: detail; fix: ...``."""
        text = f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"
        return text if self.ok or not self.fix else f"{text}; fix: {self.fix}"
