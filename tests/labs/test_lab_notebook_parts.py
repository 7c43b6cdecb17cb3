"""Every lab notebook has the parts a learner learns from: a question, the seed's expectation,
titled figures in the chapters' style, a "What to try" list, and a quiz of at least two
questions graded by the chapters' machinery; references are links into docs/sources.md."""

from __future__ import annotations

import json
import re

import pytest

nbformat = pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")

from workbench.quiz.labbank import lab_quiz_names, load_lab_quiz  # noqa: E402

from .test_lab_notebooks import NOTEBOOKS, ROOT  # noqa: E402

LABDATA = ROOT / "workbench" / "quiz" / "labdata"
# a reference is a Markdown link into docs/sources.md with one of these anchors
LINK = re.compile(r"\[[^\]]+\]\(\.\./docs/sources\.md#(seed-00[013]-(?:s\d+(?:-\d+)*|e\d+)"
                  r"|research-[a-z]+-s\d+(?:-\d+)*)\)")
BARE = re.compile(r"seed 00\d|\b00[013] (?:E\d|§)|research/|§\s?\d")


def _markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _code(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1).strip() if m else ""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_notebook_has_its_parts(path):
    nb = nbformat.read(path, as_version=4)
    text, code = _markdown(nb), _code(nb)
    assert len(_section(text, "Question")) > 40, f"{path.name}: no question"
    assert "?" in _section(text, "Question")
    assert len(_section(text, "What the seed expects")) > 60, f"{path.name}: no expectation"
    assert "show_figures(result" in code  # titled, styled figures from the LabResult
    tries = re.findall(r"^\d+\. ", _section(text, "What to try"), re.M)
    assert 2 <= len(tries) <= 3, f"{path.name}: What to try has {len(tries)} items"
    assert f'show_lab_quiz("{path.stem}")' in code
    assert len(load_lab_quiz(path.stem).questions) >= 2
    last = [c for c in nb.cells if c.cell_type == "code"][-1].source
    assert "show_lab_quiz" in last  # the notebook ends on the quiz, not on a raw table


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_notebook_imports_only_the_lab_registry(path):
    """The lab packages are free to move: a notebook reaches a lab through workbench.labs'
    registry (run_lab, get_lab, LABS) and reads what it returns, never a lab module."""
    code = _code(nbformat.read(path, as_version=4))
    assert not re.search(r"workbench\.labs\.\w", code), path.name
    for m in re.finditer(r"from workbench\.labs import ([\w, ]+)", code):
        assert {n.strip() for n in m.group(1).split(",")} <= {"run_lab", "get_lab", "LABS"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_notebook_cites_by_link(path):
    text = _markdown(nbformat.read(path, as_version=4))
    assert LINK.search(text), f"{path.name} links no source"
    bare = BARE.findall(LINK.sub("", text))
    assert not bare, f"{path.name}: bare references {bare}"


def test_every_lab_notebook_has_a_packaged_quiz_and_no_other():
    assert lab_quiz_names() == [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("name", lab_quiz_names())
def test_lab_quiz_cites_by_link(name):
    data = json.loads((LABDATA / f"{name}.json").read_text(encoding="utf-8"))
    strings = []

    def walk(v):
        if isinstance(v, str):
            strings.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(data)
    bare = [s for s in strings if BARE.search(LINK.sub("", s))]
    assert not bare, f"{name}: bare references in {bare}"
    assert all(LINK.fullmatch(q["source"]) for q in data["questions"]), name
