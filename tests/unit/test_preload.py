"""`lean.preload`: a module imported by a thread of its own while the caller goes on; the caller's
own import waits for it; a failed import is raised by the caller's own import, not lost; what the
import made is frozen out of the cyclic garbage collector."""

from __future__ import annotations

import gc
import importlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services import lean


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("tm_preload_")]:
        del sys.modules[name]


def test_the_module_is_imported_by_another_thread_and_waited_for(modules: Path) -> None:
    (modules / "tm_preload_slow.py").write_text(
        "import threading, time\ntime.sleep(0.3)\nIMPORTED_BY = threading.current_thread().name\n"
    )
    lean.preload("tm_preload_slow")
    lean.preload("tm_preload_slow")  # once per process
    slow = importlib.import_module("tm_preload_slow")  # waits for the thread's import
    assert slow.IMPORTED_BY == "preload tm_preload_slow" != threading.current_thread().name
    lean.preloaded()
    assert not any(t.name.startswith("preload ") and t.is_alive() for t in threading.enumerate())


def test_a_failed_import_is_raised_by_the_callers_own(modules: Path) -> None:
    (modules / "tm_preload_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    lean.preload("tm_preload_broken")
    lean.preloaded()
    assert "tm_preload_broken" not in sys.modules
    with pytest.raises(RuntimeError, match="broken on purpose"):
        importlib.import_module("tm_preload_broken")


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """The test process's collector as it was after the test: what a preload froze is thawed (a
    frozen object freed later would change the freeze count other tests compare)."""
    before = gc.get_freeze_count()
    yield
    if before == 0:
        gc.unfreeze()


def test_what_the_import_made_is_frozen_out_of_the_collector(modules: Path) -> None:
    """The import runs with the cyclic collector paused, and its objects are frozen after it (not
    walked by the collector's later passes); the collector runs again once it is done."""
    (modules / "tm_preload_many.py").write_text(
        "import gc\nENABLED = gc.isenabled()\nOBJECTS = [{'n': [n]} for n in range(20000)]\n"
    )
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    lean.preload("tm_preload_many")
    lean.preloaded()
    many = importlib.import_module("tm_preload_many")
    assert many.ENABLED is False
    assert gc.get_freeze_count() >= frozen + 40000  # each dict and each list
    assert gc.isenabled()


def test_a_collector_paused_by_its_owner_stays_paused(modules: Path) -> None:
    """A preload made while the command's own imports hold the collector paused leaves it paused
    and freezes nothing: the owner does both when its imports are done."""
    (modules / "tm_preload_owned.py").write_text("OBJECTS = [[n] for n in range(1000)]\n")
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        lean.preload("tm_preload_owned")
        lean.preloaded()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.enable()
