"""The layering rules and the house rule of no import circle, checked by parsing every import of
the package's source with ``ast`` (module level, inside functions and under ``if TYPE_CHECKING:``
alike: a circle a reader must untangle is one whether or not it runs). Nothing is imported, so
the checks hold on any machine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workbench

ROOT = Path(workbench.__file__).resolve().parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    return parse_imports(path.read_text(), module_name(path), path.name == "__init__.py")


def parse_imports(source: str, module: str, is_package: bool = False,
                  modules: set[str] | None = None) -> set[str]:
    """Every name ``module``'s ``source`` imports, wherever the import stands. ``from P import
    N`` gives ``P`` and ``P.N`` (N may be a module or a name of P's); with ``modules`` (the
    package's own), only the one it needs: ``P.N`` where that is a module (P's ``__init__`` may
    still be running, as when P imports this module), else ``P``."""
    tree = ast.parse(source, module)
    pkg = module.split(".")
    if not is_package:
        pkg = pkg[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if modules is None:
                    out.update((base, sub))
                else:
                    out.add(sub if sub in modules else base)
    return out


FILES = {module_name(p): p for p in ROOT.rglob("*.py")}
GRAPH = {m: imports_of(p) for m, p in FILES.items()}
# module -> the package's own modules it needs (itself left out)
TREE = {m: parse_imports(p.read_text(), m, p.name == "__init__.py", set(FILES)) & set(FILES) - {m}
        for m, p in FILES.items()}


def importers(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".")}


def hits(deps: set[str], banned: tuple[str, ...]) -> set[str]:
    return {d for d in deps for b in banned if d == b or d.startswith(b + ".")}


def test_the_graph_sees_known_imports():
    # the parser itself: a known module-level and a known function-level import
    assert "workbench.engines.sched.scheduler.Scheduler" in GRAPH["workbench.engines.sim.driver"]
    assert "workbench.labs.colocation.sim" in GRAPH["workbench.labs.colocation.lab"]


@pytest.mark.parametrize("prefix,banned", [
    # the pure scheduling part: no SimPy, no torch, no simulated or real engine
    ("workbench.engines.sched", ("simpy", "torch", "workbench.sim", "workbench.engines.sim",
                                 "workbench.mini", "workbench.gpu")),
    ("workbench.engines.base", ("simpy", "torch", "workbench.sim", "workbench.engines.sim")),
    ("workbench.engines.models", ("simpy", "torch", "workbench.sim")),
    ("workbench.engines.metrics", ("simpy", "torch", "workbench.sim")),
    # the CUDA backend stands beside the simulator, never on it
    ("workbench.gpu", ("workbench.sim", "workbench.engines", "workbench.bench")),
    # the engine stays below the labs: labs import mini, never the other way round
    ("workbench.mini", ("workbench.labs", "workbench.bench")),
    ("workbench.engines", ("workbench.labs", "workbench.bench", "workbench.mini")),
    ("workbench.core", ("workbench.sim", "workbench.gpu", "workbench.host", "workbench.engines",
                        "workbench.bench", "simpy", "torch")),
    ("workbench.sim", ("workbench.bench", "workbench.engines", "workbench.labs")),
    ("workbench.transport", ("workbench.bench",)),
])
def test_layer_does_not_import(prefix, banned):
    found = {m: sorted(hits(deps, banned)) for m, deps in importers(prefix).items()}
    assert {m: v for m, v in found.items() if v} == {}


def test_benchmarks_are_never_imported_below_them():
    users = {m for m, deps in GRAPH.items() if hits(deps, ("workbench.bench",))
             and not m.startswith(("workbench.bench", "workbench.cli"))}
    assert users == set()


def test_importing_the_schedulers_loads_no_simpy():
    import subprocess
    import sys

    code = ("import sys\n"
            "import workbench.engines.sched.vllm_sched, workbench.engines.sched.sglang_sched\n"
            "import workbench.engines.base, workbench.engines.models, workbench.engines.metrics\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('simpy', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of ``graph`` (module -> the modules it imports): modules
    each reachable from the others, so none can be read or imported first; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's algorithm
        index[m] = low[m] = len(index)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if d not in graph:
                continue
            if d not in index:
                visit(d)
                low[m] = min(low[m], low[d])
            elif d in stack:
                low[m] = min(low[m], index[d])
        if low[m] == index[m]:
            group = []
            while (d := stack.pop()) != m:
                group.append(d)
            group.append(m)
            if len(group) > 1 or m in graph[m]:
                groups.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(groups)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per tangle of ``graph``: the shortest path from its first module back
    to it, e.g. ``[a, b, a]``."""
    return [_path_back(graph, set(g), g[0]) for g in tangles(graph)]


def _path_back(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """The shortest path inside ``group`` from ``start`` back to itself."""
    came: dict[str, str] = {}
    todo = [start]
    while todo:
        m = todo.pop(0)
        for d in sorted(graph[m] & group):
            if d == start:
                back = [m]
                while back[-1] != start:
                    back.append(came[back[-1]])
                return [*reversed(back), start]
            if d not in came:
                came[d] = m
                todo.append(d)
    raise AssertionError(f"{start} is in no circle of {sorted(group)}")


def circle_report(graph: dict[str, set[str]]) -> str:
    """Each tangle as one circle of it, and the modules it ties together when there are more."""
    lines = []
    for group, path in zip(tangles(graph), circles(graph), strict=True):
        more = sorted(set(group) - set(path))
        lines.append(" -> ".join(path) + (f" (tied up with {', '.join(more)})" if more else ""))
    return "; ".join(lines)


def test_no_import_circle_anywhere_in_the_package():
    found = tangles(TREE)
    assert not found, (f"{len(found)} import circle(s) (TYPE_CHECKING and function-level imports "
                       f"count): {circle_report(TREE)}")


def test_a_circle_is_named_with_its_whole_tangle():
    # three tangled modules where the shortest way back is two
    graph = {"a": {"b", "c"}, "b": {"a"}, "c": {"b"}, "d": {"a"}}
    assert tangles(graph) == [["a", "b", "c"]]
    assert circles(graph) == [["a", "b", "a"]]
    assert circle_report(graph) == "a -> b -> a (tied up with c)"


def test_the_circle_finder_names_each_circle():
    assert circles({"a.x": {"a.y"}, "a.y": {"a.x"}}) == [["a.x", "a.y", "a.x"]]
    assert circles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "b": {"a.x"}}) == [
        ["a.x", "a.y", "a.z", "a.x"]]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [
        ["a", "b", "a"], ["c", "d", "c"]]
    assert circles({"a.x": {"a.y"}, "a.y": set(), "a.z": {"a.x", "a.y"}}) == []


def test_the_parser_counts_type_checking_and_function_level_imports():
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n"
              "    from workbench.core.ledger import KVCacheManager\n"
              "def f():\n"
              "    from . import sibling\n"
              "    import workbench.units as u\n")
    got = parse_imports(source, "workbench.core.thing")
    assert {"workbench.core.ledger", "workbench.core.sibling", "workbench.units"} <= got


def test_a_submodule_imported_from_its_package_needs_the_submodule_alone():
    # ``from P import sub`` needs P.sub, ``from P import name`` needs P's __init__
    source = "from workbench.core import ledger, NAME\nimport workbench.units\n"
    mods = {"workbench.core", "workbench.core.ledger", "workbench.units"}
    assert parse_imports(source, "workbench.x", modules=mods) == {
        "workbench.core.ledger", "workbench.core", "workbench.units"}
    assert parse_imports("from workbench.core import ledger\n", "workbench.x",
                         modules=mods) == {"workbench.core.ledger"}


# facts with one home: a unit of bytes lives in units.py, the environment's prefix in settings.py
HOMES = {**dict.fromkeys(("KiB", "MiB", "GiB", "TiB", "PiB", "MAX_SIZE"), "workbench.units"),
         "ENV_PREFIX": "workbench.settings"}


def assigned_names(path: Path) -> set[str]:
    """The names a module binds by assignment anywhere (module level, classes, functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for t in targets:
            out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return out


def test_a_unit_or_the_env_prefix_is_defined_once():
    found = {module_name(p): sorted(n for n in assigned_names(p) & HOMES.keys()
                                    if HOMES[n] != module_name(p))
             for p in ROOT.rglob("*.py")}
    assert {m: v for m, v in found.items() if v} == {}
    assert {"GiB", "MiB"} <= assigned_names(ROOT / "units.py")  # the scan sees the home's own
