"""The labs' shape, checked by parsing every import under ``workbench/labs`` with ``ast``
(module level, inside functions and under ``if TYPE_CHECKING:``; nothing is imported):
``labs/`` holds the registry, the kit and one package per lab; a lab imports only the kit and
the layers below, never another lab; and no import circle exists inside ``labs/``, the
``TYPE_CHECKING`` imports counted (a circle a reader must untangle is one whether or not it
runs; tests/engines/test_import_rules.py checks the whole package the same way).
"""

from __future__ import annotations

import ast
from pathlib import Path

import workbench.labs
from workbench.labs import LABS

LABS_DIR = Path(workbench.labs.__file__).resolve().parent
ROOT = LABS_DIR.parent.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The ``workbench.labs`` modules ``path`` imports (a package's modules, not its names)."""
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
    return {m for m in out if m in MODULES}


MODULES = {module_name(p) for p in LABS_DIR.rglob("*.py")}
GRAPH = {module_name(p): imports_of(p) for p in LABS_DIR.rglob("*.py")}


def lab_of(module: str) -> str | None:
    """The lab package a module belongs to (None: the registry or the kit)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[2] == "kit":
        return None
    return parts[2]


def test_labs_holds_the_registry_the_kit_and_one_package_per_lab():
    files = {p.name for p in LABS_DIR.iterdir() if p.is_file() and p.suffix == ".py"}
    assert files == {"__init__.py"}
    dirs = {p.name for p in LABS_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {target.split(":")[0].split(".")[2] for target in LABS.values()}
    assert dirs == packages | {"kit"}
    for name, target in LABS.items():
        module, _, cls = target.partition(":")
        assert module.endswith(".lab"), name  # the registry points at each lab's lab.py
        init = (LABS_DIR / module.split(".")[2] / "__init__.py").read_text()
        assert cls in init, name  # and the package re-exports its Lab class


def test_the_graph_sees_known_imports():
    # a module-level and a function-level import, so an empty graph cannot pass
    assert "workbench.labs.kit.base" in GRAPH["workbench.labs.baseline.lab"]
    assert "workbench.labs.colocation.sim" in GRAPH["workbench.labs.colocation.lab"]


def test_a_lab_imports_no_other_lab():
    found = {m: sorted(d for d in deps if lab_of(d) not in (None, lab_of(m)))
             for m, deps in GRAPH.items()}
    assert {m: v for m, v in found.items() if v} == {}


def test_the_kit_imports_no_lab():
    found = {m: sorted(d for d in deps if lab_of(d) is not None)
             for m, deps in GRAPH.items() if m.startswith("workbench.labs.kit")}
    assert {m: v for m, v in found.items() if v} == {}


def test_a_runner_never_imports_its_report():
    for m, deps in GRAPH.items():
        if m.rsplit(".", 1)[-1] in ("sim", "mini", "real", "vllm", "server"):
            assert not {d for d in deps if d.endswith(".report")}, m


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in ``graph`` (module -> the modules it imports), or None."""
    edges = {m: set(deps) for m, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if d == m or d not in edges:
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle_inside_labs():
    assert _cycle(GRAPH) is None


def test_the_cycle_finder_finds_one():
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.x"}}) == ["a.x", "a.y", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None
