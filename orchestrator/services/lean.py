"""pyarrow without pandas in a run's process.

pyarrow looks for pandas the first time it converts Python objects (`pa.array`, `pa.scalar`:
is this a Series?) and imports it when it is installed (Airflow and pyspark bring it). Nothing in a
run hands pyarrow pandas objects, and importing pandas took 0.2-0.3 s of every run (a run of 1M-row
``shop.orders`` with no change: 1.12 → 0.94 s, docs/performance.md, "What limits each").
`arrow_without_pandas` makes that first look find no pandas, so pyarrow skips the check from then
on. Anything in the run that does need pandas still gets it: pyarrow imports it again where pandas
is required (``to_pandas``, ``from_pandas``), and an ``import pandas`` works as before.

Called by `tidemark run` and, in a task process of a Tidemark DAG, by the DAG module
(`orchestrator.app.airflow_dags`), before they import the engine: processes that run
nothing else. Elsewhere it is not called: until something calls ``to_pandas`` or
``from_pandas``, pyarrow then takes pandas objects as plain sequences (a float Series' NaN
stays NaN instead of null, a Categorical is not dictionary-encoded, nanosecond timestamps are
not pandas Timestamps). A Spark Connect client attached through ``spark.remote`` imports
pandas itself (it requires it) and hands pyarrow Python rows, not pandas objects: Tidemark
creates its small DataFrames from lists and collects rows (tests/integration/
test_spark_connect.py runs through such a server).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses ``pandas`` to the thread that made it, while it is on `sys.meta_path` (another
    thread importing pandas meanwhile gets it)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if threading.get_ident() == self.thread and (
            fullname == "pandas" or fullname.startswith("pandas.")
        ):
            raise ModuleNotFoundError("pandas is not imported by a tidemark run", name=fullname)
        return None


def arrow_without_pandas() -> None:
    """pyarrow's one look for pandas, made now with pandas refused; nothing when pandas was
    already imported (pyarrow uses it, as before)."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa

        pa.scalar(0)  # the first conversion of a Python object: pyarrow looks for pandas here
    finally:
        sys.meta_path.remove(finder)
