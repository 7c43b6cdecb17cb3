"""Issue 38's "Done when", read from the notebooks themselves: every chapter and lab notebook,
and the Markdown a lab's report is made of, cites only what a learner can open, none of the ten
statements the third teaching pass corrected reads as before, and every exercise list asks for a
prediction before it shows the outcome."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.citations import link_seed_refs
from workbench.labs.kit.base import LabResult

from .test_sources import BARE, LINK, bare_references

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted([*ROOT.glob("chapters/[0-9][0-9]_*.ipynb"),
                    *ROOT.glob("labs/[0-9][0-9]_*.ipynb")])
RESEARCH = re.compile(r"(?i)\bresearch/|#research-|\bkvcached\.md\b")
# the ten statements' wrong wording, each as it read before (issue 38, item 3)
WRONG = [
    "which SGLang's\n  scheduler already handles", "which SGLang's scheduler already handles",
    "reads the zero page (a write would fault)", "The API layer makes a `Request`",
    "With\nTP = 1 and vLLM's in-process executor", "that holds a copy of the range",
    "its own copy of the request's pages", "JupyterLab's file browser is rooted at `chapters/`",
    "research/kvcached.md", "p99 17-28x", "highest PEAKs (19-20)", "with its token allocator",
    "is true exactly when\n  there are Mamba layers", "read from its release, not\nfrom code",
]
EXERCISES = re.compile(r"^## (What to try|Exercises)\b", re.M)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_cites_only_what_a_learner_can_open(path):
    assert bare_references(path) == []
    text = "\n".join(_src(c) for c in _cells(path))
    assert not RESEARCH.search(text), RESEARCH.search(text)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_none_of_the_ten_statements_reads_as_before(path):
    text = "\n".join(_src(c) for c in _cells(path))
    assert [w for w in WRONG if w in text] == []


def asks_first(cells: list[dict]) -> bool:
    """After the exercise heading, a code cell leaves a guess to fill (``… = None``) and checks
    it (``check(`` or ``ask(``) before any other code cell runs."""
    at = next((i for i, c in enumerate(cells)
               if c["cell_type"] == "markdown" and EXERCISES.search(_src(c))), None)
    if at is None:
        return False
    code = next((_src(c) for c in cells[at + 1:] if c["cell_type"] == "code"), "")
    guess = re.search(r"^\w+_guess = None|^\w+ = None  # \d\.", code, re.M)
    return bool(guess) and re.search(r"\b(check|ask)\(", code[guess.end():]) is not None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_list_asks_for_a_prediction_before_its_answer(path):
    assert asks_first(_cells(path)), f"{path.stem}: its exercises tell before they ask"


def test_a_lab_report_links_its_seed_references_in_one_place():
    md = "as seed 000 §14.3 expects; seed 003 E5 and seed 003 §3 (E1); [seed 001 §8](x) stays"
    out = LabResult(SimpleNamespace(), md).markdown  # the hook reads the Markdown alone
    assert out == link_seed_refs(md)
    assert "[seed 000 §14.3](../docs/sources.md#seed-000-s14-3)" in out
    assert "(../docs/sources.md#seed-003-e1)" in out and "[seed 001 §8](x)" in out
    rest = LINK.sub(" ", out)
    assert not BARE["a source document by its seed number"].search(rest)


LABS = sorted(ROOT.glob("labs/[0-9][0-9]_*.ipynb"))


def queue_notebook_runs(selected=()):
    """The lab notebooks' headless runs that the selected tests below read, queued as the
    session starts (tests/conftest.py); none without the notebook stack."""
    labs = [p for p in LABS if p in selected]
    if labs and importlib.util.find_spec("nbformat") is not None:
        from tests.labs.test_lab_notebooks import queue_notebook_runs as queue_labs

        queue_labs(labs)


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_a_lab_reports_markdown_cites_only_what_a_learner_can_open(path):
    """The Markdown the lab's run cell displays (the run the lab notebook test makes)."""
    pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")
    from tests.labs.test_lab_notebooks import run_lab_notebook

    nb, _ = run_lab_notebook(path)
    shown = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code"
             for o in c.outputs if "text/markdown" in o.get("data", {})]
    assert shown, f"{path.stem}: its run cell showed no report"
    for md in shown:
        rest = LINK.sub(" ", md)
        assert not BARE["a source document by its seed number"].search(rest), path.stem
        assert not BARE["a section or experiment of a source document"].search(rest), path.stem
        assert not RESEARCH.search(md), path.stem


def test_the_colocation_report_cites_kvcached_public_benchmark():
    from workbench.labs import get_lab, run_lab

    md = run_lab("colocation", get_lab("colocation").params(peaks=(12,), workers=1),
                 "sim").markdown
    rest = LINK.sub(" ", md)
    assert not RESEARCH.search(md) and not BARE["a source document by its seed number"].search(
        rest)
    assert "#upstream-kvcached-colocation" in md and "p99 7.8-28x" in md
    assert "(18-20)" in md and "moves it to PEAK 15 over all nine PEAKs" in md
