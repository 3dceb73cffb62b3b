"""A decode worker process (`orchestrator.binlog.pool`): ``python -m orchestrator.binlog.worker``.

pyarrow's one look for pandas is made first, with pandas refused
(`orchestrator.services.lean.arrow_without_pandas`): the decoding modules convert a Python value
when they are imported, which imported pandas, 0.3 s of each worker's start while the capture
waited for its first results. Then the pool's loop (`orchestrator.binlog.pool.main`), imported
by its own name: what it pickles must be found there by the capture.

May import: orchestrator, services, binlog.
"""

from __future__ import annotations

from orchestrator.services.lean import arrow_without_pandas

if __name__ == "__main__":
    arrow_without_pandas()
    from orchestrator.binlog import pool

    pool.main()
