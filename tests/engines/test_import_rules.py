"""The layering rules, checked by parsing every import (module level and inside functions) of
the package's source with ``ast``: nothing is imported, so the check holds on any machine."""

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
    tree = ast.parse(path.read_text(), str(path))
    pkg = module_name(path).split(".")
    if path.name != "__init__.py":
        pkg = pkg[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


GRAPH = {module_name(p): imports_of(p) for p in ROOT.rglob("*.py")}


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
