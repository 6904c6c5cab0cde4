"""The package's import rules (docs/reference/layout.md), read from every module's source with
``ast``: lazy imports inside functions count as much as those at the top."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import sysconfig
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "parsearch"
STDLIB = frozenset(sys.stdlib_module_names)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute name an ``ImportFrom`` imports from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    is_package = modules()[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def imports(module: str) -> frozenset[str]:
    """Every module ``module`` imports, anywhere in its body (``TYPE_CHECKING`` blocks aside:
    they never run). ``from a import b`` counts as importing ``a.b`` when that is a module."""
    tree = ast.parse(modules()[module].read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            found.add(source)
            found.update(
                f"{source}.{alias.name}"
                for alias in node.names
                if f"{source}.{alias.name}" in modules()
            )
    return frozenset(found)


def internal(module: str) -> set[str]:
    return {name for name in imports(module) if name.split(".")[0] == "parsearch"}


def external(module: str) -> set[str]:
    """Top-level names of the third-party packages ``module`` imports."""
    tops = {name.split(".")[0] for name in imports(module)}
    return {top for top in tops if top != "parsearch" and top not in STDLIB}


def within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def members(package: str) -> list[str]:
    return [name for name in modules() if within(name, package)]


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {name}"
        for module in members(package)
        for name in internal(module)
        if within(name, *forbidden)
    )


def test_every_module_is_read() -> None:
    assert {"parsearch.cli", "parsearch.store.sqlite", "parsearch.launch.process"} <= set(modules())
    assert "parsearch.errors" in imports("parsearch.config")
    assert "parsearch.campaign.session" in imports("parsearch.commands.run")  # a lazy import


def test_trainers_do_not_import_backends_the_loop_or_the_store() -> None:
    forbidden = ("parsearch.backends", "parsearch.campaign", "parsearch.store", "parsearch.cli")
    assert violations("parsearch.trainers", forbidden) == []


def test_launch_knows_no_trainer_backend_loop_or_store() -> None:
    forbidden = (
        "parsearch.trainers",
        "parsearch.backends",
        "parsearch.campaign",
        "parsearch.search",
        "parsearch.store",
    )
    assert violations("parsearch.launch", forbidden) == []


def test_search_does_not_import_the_loop_backends_or_store() -> None:
    forbidden = ("parsearch.campaign", "parsearch.backends", "parsearch.store")
    assert violations("parsearch.search", forbidden) == []


def test_store_imports_only_config_errors_result_and_pandas() -> None:
    allowed = (
        "parsearch.store",
        "parsearch.config",
        "parsearch.errors",
        "parsearch.result",
        "parsearch.version",
    )
    for module in members("parsearch.store"):
        assert {n for n in internal(module) if not within(n, *allowed)} == set(), module
        # psycopg: the PostgreSQL store's driver, imported only when one is opened.
        assert external(module) <= {"pandas", "numpy", "pyarrow", "psycopg"}, module


def test_estimate_is_pure() -> None:
    """The estimate (its profile format included) needs only the configuration types and the
    two leaf modules that read units and raise input errors; no third-party package."""
    allowed = ("parsearch.estimate", "parsearch.config", "parsearch.errors", "parsearch.units")
    for module in members("parsearch.estimate"):
        assert {n for n in internal(module) if not within(n, *allowed)} == set(), module
        assert external(module) == set(), module
    for leaf in ("parsearch.errors", "parsearch.units"):
        assert internal(leaf) == set() and external(leaf) == set(), leaf


def test_the_space_does_not_import_the_probe() -> None:
    """The probe measures for a space (it imports the space); the space reads profiles
    through the estimate's format, never through the probe."""
    assert violations("parsearch.space", ("parsearch.probe",)) == []
    assert violations("parsearch.profiles", ("parsearch.probe", "parsearch.space")) == []


def test_nothing_imports_the_command_line() -> None:
    entry = {"parsearch.cli", "parsearch.__main__"}
    users = sorted(
        f"{module} imports {name}"
        for module in modules()
        if module not in entry and not within(module, "parsearch.commands")
        for name in internal(module)
        if within(name, "parsearch.cli", "parsearch.commands")
    )
    assert users == []


def part(module: str) -> str:
    """The part of the package a module belongs to: ``parsearch.campaign.lease`` ->
    ``parsearch.campaign``, ``parsearch.query`` -> itself."""
    return ".".join(module.split(".")[:2])


def module_graph() -> dict[str, set[str]]:
    return {m: {n for n in internal(m) if n in modules() and n != m} for m in modules()}


def part_graph() -> dict[str, set[str]]:
    """Which parts import which, through any of their modules; the package's own
    ``__init__`` (``import parsearch``) is no part."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        if module == "parsearch":
            continue
        graph.setdefault(part(module), set()).update(
            part(n) for n in imported if n != "parsearch" and part(n) != part(module)
        )
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _why(graph_cycle: list[str]) -> str:
    """A part-level cycle with the module imports that make each of its steps."""
    steps = []
    for a, b in itertools.pairwise(graph_cycle):
        edges = sorted(
            f"{m} imports {n}"
            for m, imported in module_graph().items()
            if m != "parsearch" and part(m) == a
            for n in imported
            if part(n) == b
        )
        steps.append(f"{a} -> {b}: {'; '.join(edges)}")
    return "\n".join(steps)


def test_no_import_cycle_lazy_ones_included() -> None:
    found = _cycle(module_graph())
    assert found is None, " -> ".join(found or [])


def test_no_import_cycle_between_parts() -> None:
    """Parts (``campaign``, ``query``, ``probe``, ``space``, ``trainers``, ...) import each
    other one way only, lazy imports inside functions included: a part that needs a thing of
    a part that needs it back has the thing in the wrong place."""
    found = _cycle(part_graph())
    assert found is None, _why(found or [])


@pytest.mark.parametrize("level", ["modules", "parts"])
def test_the_cycle_finder_finds_a_cycle(monkeypatch: pytest.MonkeyPatch, level: str) -> None:
    real = internal
    # config imports errors; make errors import config (lazily, as inside a function)
    extra = {"parsearch.errors": {"parsearch.config"}}
    monkeypatch.setitem(globals(), "internal", lambda m: real(m) | extra.get(m, set()))
    graph = module_graph() if level == "modules" else part_graph()
    assert _cycle(graph) is not None


def test_the_part_graph_sees_a_lazy_import() -> None:
    """``commands.run`` imports ``campaign.session`` inside a function only."""
    assert "parsearch.campaign" in part_graph()["parsearch.commands"]


@pytest.mark.parametrize(
    "statement",
    ["import parsearch", "import parsearch.cli", "import parsearch.trainers"],
)
def test_light_imports_load_no_heavy_package(statement: str) -> None:
    heavy = ["torch", "mpi4py", "ray", "numpy", "pandas", "deephyper", "psycopg"]
    code = f"{statement}; import sys; print(sorted(set({heavy!r}) & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_stdlib_names_are_known() -> None:
    assert "sqlite3" in STDLIB and "pandas" not in STDLIB
    assert sysconfig.get_paths()["stdlib"]
