"""`lean.preload`: a module imported by a thread of its own while the caller goes on; the caller's
own import waits for it; a failed import is raised by the caller's own import, not lost."""

from __future__ import annotations

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
