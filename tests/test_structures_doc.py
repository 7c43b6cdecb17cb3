"""docs/structures.md is the module map: every module under ``workbench/`` is named there, and
no table cell runs past two sentences (a map, not a wall)."""

from __future__ import annotations

import re
from pathlib import Path

import workbench

PKG = Path(workbench.__file__).resolve().parent
DOC = PKG.parent / "docs" / "structures.md"


def modules() -> list[str]:
    return sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py"))


def named(rel: str, text: str, lines: list[str]) -> bool:
    """``rel`` in backticks, or its folder (``a/b/``) and its file name in backticks on one
    line; a package's ``__init__.py`` is named by its folder alone."""
    if f"`{rel}`" in text:
        return True
    folder, _, name = rel.rpartition("/")
    if not folder:
        return False
    if name == "__init__.py" and f"`{folder}/`" in text:
        return True
    return any(f"`{folder}/`" in line and f"`{name}`" in line for line in lines)


def cells(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[-| ]+\|", line):
            out += [c.strip() for c in line.strip("|").split("|")]
    return out


def sentences(cell: str) -> int:
    """Sentences in a table cell: code spans and the usual abbreviations do not end one."""
    plain = re.sub(r"`[^`]*`", "x", cell)
    plain = re.sub(r"\b(e\.g|i\.e|vs|cf|etc)\.", "x", plain)
    return len(re.findall(r"[.!?](?=\s|$)", plain)) or 1


def test_every_module_is_named():
    text = DOC.read_text()
    lines = text.splitlines()
    missing = [m for m in modules() if not named(m, text, lines)]
    assert missing == []


def test_no_table_cell_longer_than_two_sentences():
    long = [c for c in cells(DOC.read_text()) if sentences(c) > 2]
    assert long == []


def test_the_checks_themselves():
    assert len(modules()) > 200 and "labs/kit/base.py" in modules()
    lines = ["| `labs/baseline/` | `lab.py` · `sim.py` |"]
    assert named("labs/baseline/sim.py", lines[0], lines)
    assert named("labs/baseline/__init__.py", lines[0], lines)
    assert not named("labs/baseline/report.py", lines[0], lines)
    assert sentences("One. Two, e.g. `a.b`. Three.") == 3
    assert cells("| a | b |\n|---|---|\n| c. | d |") == ["a", "b", "c.", "d"]
