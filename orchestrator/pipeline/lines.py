"""Log lines that many tables of a run share, logged once for all of them.

A run of 2,000 tables without a change would log a line per table at each step: planned
incremental, reconciled without change, kept its version. Such lines are collected
(`TableLines.add`) and logged when the step ends (`TableLines.flush`): a line only one table has
is logged as it is (``table T: ...``); tables that share a line get one INFO line naming how many
and the first few (`orchestrator.config.patterns.listed`), and each table's own line (its
version, its rows) at DEBUG (``--debug`` shows them; docs/operations.md, "Log files"). Lines of
tables that changed are not collected: each has its own INFO line when it happens.
"""

from __future__ import annotations

import logging

from orchestrator.config.patterns import listed


class TableLines:
    """Per-table log lines of one step, grouped by what they share."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._groups: dict[str, list[tuple[str, str]]] = {}

    def add(self, table: str, own: str, shared: str) -> None:
        """``own``: the table's line (``table <table>: <own>``); ``shared``: what the line says
        that other tables' lines may say too, the line logged for all of them."""
        self._groups.setdefault(shared, []).append((table, own))

    def flush(self) -> None:
        """Log the lines added since the last flush, one per group of tables sharing it."""
        for shared, lines in self._groups.items():
            if len(lines) == 1:
                self._log.info("table %s: %s", *lines[0])
                continue
            self._log.info(
                "%d tables: %s (%s)", len(lines), shared, listed([table for table, _ in lines])
            )
            if self._log.isEnabledFor(logging.DEBUG):
                for line in lines:
                    self._log.debug("table %s: %s", *line)
        self._groups.clear()
