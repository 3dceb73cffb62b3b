"""pyarrow in a run's process: without pandas, on the C library's allocator; and slow imports
made by a thread of their own (`preload`).

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

import contextlib
import gc
import importlib
import importlib.abc
import importlib.machinery
import os
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


#: The environment variable pyarrow reads, once, for its default allocator.
POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def system_allocator() -> None:
    """Arrow's buffers from the C library's allocator (``malloc``), in this process and the
    processes it starts (decode, reconcile and publish workers), unless `POOL_VARIABLE` names
    another.

    pyarrow's default, mimalloc, made a run's first large computations slow: on 1M changes,
    the first `orchestrator.pipeline.reconcile.local.last_events` took 0.8-1.1 s in a fresh
    process against 0.36-0.43 s with ``malloc``, and reading the change segments 0.22-0.54 s
    against 0.26 s (docs/performance.md, "What limits each"). A run allocates its large
    buffers once and frees them when its step ends; ``malloc`` gives buffers that large
    straight from the system (``mmap``) and back to it when freed.
    """
    if POOL_VARIABLE in os.environ:
        return
    os.environ[POOL_VARIABLE] = "system"
    if "pyarrow" in sys.modules:  # already imported: it read the variable then
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


_preloads: dict[str, threading.Thread] = {}
_preloads_lock = threading.Lock()


def preload(name: str) -> None:
    """Start importing module ``name`` in a thread of its own, once per process: a step that is
    about to need a slow import (pyiceberg's, 0.3-0.5 s) gets it made while its own thread
    works, where Arrow releases the interpreter. The step's own ``import`` then waits for that
    thread (the import system's module lock) or finds the module there. A failed import is
    left to the step's own, which raises it where it is needed.

    A process that forks must call `preloaded` first: a child forked while another thread
    imports would inherit the import lock held."""
    with _preloads_lock:
        if name in sys.modules or name in _preloads:
            return
        thread = threading.Thread(target=_import, args=(name,), name=f"preload {name}", daemon=True)
        _preloads[name] = thread
        thread.start()


def preloaded() -> None:
    """Wait until every `preload` started in this process has ended."""
    with _preloads_lock:
        threads = list(_preloads.values())
    for thread in threads:
        thread.join()


def _import(name: str) -> None:
    """Import ``name`` with the cyclic garbage collector paused, then freeze what the import
    made out of its passes, as `orchestrator.app.cli.entry` does for a command's imports.

    pyiceberg's import makes a few hundred thousand long-lived objects (pydantic models, their
    schemas) while the reconcile's threads work: with the collector on, its passes over them
    took 0.06-0.08 s of a 4M-row incremental run, on the interpreter's lock the merge needs; 6 ms
    paused (docs/performance.md, "What limits each"). A collector already paused (a command's
    own imports still under way) is left to its owner."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        with contextlib.suppress(Exception):  # the step's own import raises it, where it is needed
            importlib.import_module(name)
    finally:
        if paused:
            gc.freeze()
            gc.enable()
