"""The package's shape (docs/layout.md): rooms in layers that import one way, no import cycles,
formatted modules of a readable size.

A room is a subpackage of ``orchestrator/``, a loose module of it, the ``chunking`` package, or
the ``dags`` folder. Each room's docstring ends with the rooms it may import ("May import: ...");
every room may import only rooms below it in `LAYERS`, and what it imports must be among those
it names. The import graph counts every import, function-local ones and ``TYPE_CHECKING`` ones
included: a local import that only hides a cycle is still a cycle.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "chunking", "dags")
MAX_LINES = 600  # after `ruff format`: split a module by concern, never by squeezing lines
STEPS = ("plan", "read", "capture", "reconcile", "publish")
#: The rooms, bottom to top: a room imports only rooms before it.
LAYERS = (
    "orchestrator",  # the package's own __init__: its version
    "errors",
    "positions",
    "services",
    "schema",
    "chunking",
    "config",
    "state",
    "lake",
    "source",
    "binlog",
    "pipeline",
    "app",
    "__main__",
    "dags",
)
MAY_IMPORT = re.compile(r"May import:(.*?)(?:\n\s*\n|\Z)", re.S)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def room_of(module: str) -> str:
    """The room a module belongs to: ``orchestrator.pipeline.plan.step`` -> ``pipeline``.

    >>> room_of("orchestrator.pipeline.plan.step"), room_of("orchestrator.errors")
    ('pipeline', 'errors')
    >>> room_of("orchestrator"), room_of("chunking.mysql"), room_of("dags.tidemark_dags")
    ('orchestrator', 'chunking', 'dags')
    """
    parts = module.split(".")
    if parts[0] != "orchestrator":
        return parts[0]
    return parts[1] if len(parts) > 1 else "orchestrator"


def room_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Room -> the rooms it imports -> the module edges behind each (``a -> b``)."""
    rooms: dict[str, dict[str, set[str]]] = {}
    for module, targets in graph.items():
        mine = rooms.setdefault(room_of(module), {})
        for target in targets:
            other = room_of(target)
            if other != room_of(module):
                mine.setdefault(other, set()).add(f"{module} -> {target}")
    return rooms


def declared(room: str) -> set[str] | None:
    """The rooms ``room``'s docstring says it may import (its package's ``__init__``, the loose
    module itself; the ``dags`` folder: each file's); None when it says nothing."""
    modules = _modules()
    if room == "dags":
        paths = [path for name, path in modules.items() if room_of(name) == "dags"]
    else:
        paths = [modules["orchestrator" if room == "orchestrator" else _room_module(room)]]
    found: set[str] | None = None
    for path in paths:
        doc = ast.get_docstring(parsed(path.read_text(), str(path))) or ""
        match = MAY_IMPORT.search(doc)
        if match is None:
            return None
        text = match.group(1).strip().rstrip(".")
        names = set() if text.startswith("nothing") else {n.strip() for n in text.split(",")}
        found = names if found is None else found | names
    return found


def _room_module(room: str) -> str:
    return room if room == "chunking" else f"orchestrator.{room}"


def parsed(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's spurious "AST constructor recursion depth
    mismatch" (python/cpython#106905): its AST builder's depth counter is shared between
    threads, and a thread left by an earlier test (py4j's, printing a traceback, which 3.11
    formats with ``ast``) can build an AST at the same moment. The CI run of fd4af73 failed so."""
    for attempt in range(5):
        try:
            return ast.parse(source, filename)
        except SystemError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (anywhere in its body)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(parsed(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            for target in targets:
                # `from pkg import module` imports the module; `from module import name` the module.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and modules[target].name != "__init__.py":
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_room_is_in_a_layer() -> None:
    assert set(room_graph(import_graph())) <= set(LAYERS), sorted(
        set(room_graph(import_graph())) - set(LAYERS)
    )


@pytest.mark.parametrize("room", LAYERS)
def test_a_room_says_what_it_may_import_and_imports_only_rooms_below(room: str) -> None:
    names = declared(room)
    assert names is not None, f"{room}: its docstring needs a line 'May import: <rooms>.'"
    below = set(LAYERS[: LAYERS.index(room)])
    assert names <= below, f"{room} may import only rooms below it; not {sorted(names - below)}"
    imported = room_graph(import_graph()).get(room, {})
    undeclared = {other: sorted(edges) for other, edges in imported.items() if other not in names}
    assert not undeclared, f"{room} imports rooms its docstring does not name: {undeclared}"


def test_no_loop_between_rooms() -> None:
    rooms = {room: set(targets) for room, targets in room_graph(import_graph()).items()}
    for targets in list(rooms.values()):
        for target in targets:
            rooms.setdefault(target, set())
    assert cycles(rooms) == []


def test_the_room_check_finds_a_loop_and_an_undeclared_import() -> None:
    graph = {
        "orchestrator.lake.storage": {"orchestrator.source.connection"},
        "orchestrator.source.connection": {"orchestrator.lake.storage"},
    }
    rooms = room_graph(graph)
    assert {r: set(t) for r, t in rooms.items()} == {"lake": {"source"}, "source": {"lake"}}
    assert cycles({r: set(t) for r, t in rooms.items()}) == [["lake", "source"]]


def test_the_code_is_formatted() -> None:
    """``ruff format --check`` over the repository (as `.ci/run` runs it)."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"not formatted (run `ruff format .`):\n{done.stdout}{done.stderr}"


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_is_small(name: str) -> None:
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by concern"


def test_the_pipeline_has_a_package_per_step() -> None:
    loose = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py", "positions.py"], loose
    for step in STEPS:
        assert (ROOT / "orchestrator" / "pipeline" / step / "step.py").is_file(), step


def test_subpackages_say_what_lives_there() -> None:
    for init in (ROOT / "orchestrator").glob("*/__init__.py"):
        doc = ast.get_docstring(parsed(init.read_text()))
        assert doc and len(doc) > 40, f"{init} needs a docstring saying what lives there"


def test_dags_folder_holds_only_thin_dag_files() -> None:
    files = sorted(p.name for p in (ROOT / "dags").glob("*.py"))
    assert files == ["tidemark_config_errors.py", "tidemark_dags.py"]
    for name in files:
        assert len((ROOT / "dags" / name).read_text().splitlines()) < 40


def _printed_by(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter of this checkout (its own imports)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done.stdout


def test_a_run_path_without_filters_or_queries_does_not_import_sqlglot() -> None:
    """sqlglot (70 ms) is imported only by a table's ``where`` or a QUERY event to classify."""
    code = (
        "import sys, orchestrator.config, orchestrator.app.run, orchestrator.app.steps, "
        "orchestrator.pipeline.capture.step, orchestrator.binlog.reader; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlglot'))"
    )
    assert _printed_by(code).strip() == "[]"


def test_a_run_path_does_not_import_pyarrow_dataset() -> None:
    """pyarrow's dataset module (10 ms of every process's start) is imported only where a table
    is read whole (`orchestrator.lake.manifest.read_published`: verifying, the tests)."""
    code = (
        "import sys, orchestrator.config, orchestrator.app.cli, orchestrator.app.run, "
        "orchestrator.app.early, orchestrator.app.steps, orchestrator.pipeline.capture.step, "
        "orchestrator.pipeline.reconcile.step, orchestrator.pipeline.publish.step; "
        "print(sorted(m for m in sys.modules if m.startswith('pyarrow.dataset')))"
    )
    assert _printed_by(code).strip() == "[]"


def test_a_run_that_commits_nothing_does_not_import_pyiceberg() -> None:
    """pyiceberg, and the SQLAlchemy ORM its SQL catalog imports (half a second of CPU together),
    are imported by the steps only where a table is read or committed: not by a run's start, a
    run without a change, ``status``, or an Airflow task process parsing the DAG file."""
    code = (
        "import sys, orchestrator.config, orchestrator.app.cli, orchestrator.app.run, "
        "orchestrator.app.every, orchestrator.app.steps, orchestrator.app.status, "
        "orchestrator.pipeline.capture.step, orchestrator.pipeline.reconcile.step, "
        "orchestrator.pipeline.publish.step, orchestrator.pipeline.publish.workers, "
        "orchestrator.pipeline.read.step; "
        "lazy = ('pyiceberg', 'sqlalchemy.orm', 'orchestrator.lake.iceberg'); "
        "print(sorted(m for m in sys.modules if m.startswith(lazy))); "
        # Airflow imports the ORM itself
        "import orchestrator.app.airflow_dags; "
        "print(sorted(m for m in sys.modules if m.startswith(lazy[::2])))"
    )
    assert _printed_by(code).split() == ["[]", "[]"]
