"""`tidemark run`'s reading ahead (`orchestrator.lake.readahead`), started by the CLI before the
engine's imports and by `orchestrator.app.run.run_command` (where the CLI has not): the
published files of the run's tables, unless the source's binlog ends where every one of
their versions was taken (a run with nothing to apply reads nothing ahead).

Imports nothing heavy: the CLI calls it with only pyarrow and the config imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.config import PipelineConfig

#: The longest the reading ahead waits for the source's answer (a step about to fork waits for
#: the reading thread: `orchestrator.pipeline.workers`).
ASK_SECONDS = 5


def read_ahead(config: PipelineConfig, tables: Sequence[str]) -> None:
    """Start reading ahead the published files of ``tables`` (`readahead.start`)."""
    from orchestrator.lake import readahead, storage

    readahead.start(
        [storage.table_dir(config.output.path, name) for name in tables],
        binlog_end=_binlog_end(config),
    )


def _binlog_end(config: PipelineConfig) -> Callable[[], tuple[str, int]] | None:
    """How to ask where the source's binlog ends (`orchestrator.binlog.stream.binlog_end`, on
    the reading thread); None for a password kept in an Airflow connection (asking for it
    imports Airflow)."""
    if config.source.airflow_conn_id is not None:
        return None

    def end() -> tuple[str, int]:
        from orchestrator.binlog.stream import binlog_end

        return binlog_end(config.source, config.resolve_password(), ASK_SECONDS)

    return end
