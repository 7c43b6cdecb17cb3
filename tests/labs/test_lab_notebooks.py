"""Every lab notebook (``labs/NN_name.ipynb``) is thin, stored without outputs, and runs headless
on its parameters cell's backend (sim; host for a lab that needs real tokens): no error output,
and its run cell prints the record line (``record: <id> - <verdict>``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.chapters.nbrun import executed, run_ahead
from tests.chapters.theme import assert_one_theme
from workbench.labs import get_lab

nbformat = pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "labs").glob("[0-9][0-9]_*.ipynb"))
LIMIT_S = 120  # the lab itself must finish in 60 s; the rest is the kernel starting


def lab_env() -> dict[str, str]:
    """A lab kernel's environment: scores in memory, this checkout's code first."""
    return {"WORKBENCH_SCORES": "", "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def queue_notebook_runs(selected=()):
    """The headless runs of the notebooks among ``selected`` (by path or stem), queued as the
    session starts (tests/conftest.py)."""
    named = [p for p in NOTEBOOKS if p in selected or p.stem in selected]
    run_ahead(named, timeout=LIMIT_S, env=lab_env())


def run_lab_notebook(path: Path):
    """Execute ``path`` in a fresh "workbench" kernel (python3 if that is missing), from the
    labs folder as a learner would, once per session (the browser test opens the same run);
    returns (notebook, seconds)."""
    return executed(path, timeout=LIMIT_S, env=lab_env())


def test_notebooks_found():
    assert NOTEBOOKS, "no labs/NN_name.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_notebook_structure(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert code.count("run_lab(") == 1
    # CI runs the parameters cell's backend: sim where the lab has it, else host (the CPU, for
    # a lab that needs real tokens, which sim has not); both run on any machine
    backend = re.search(r'^backend = "(\w+)"', tagged[0].source, re.M)
    lab = re.search(r'run_lab\("([\w-]+)"', code)
    assert backend and lab
    backends = get_lab(lab.group(1)).backends
    assert backend.group(1) == ("sim" if "sim" in backends else "host") in backends
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "seed 00" in text.lower() and "what to read" in text.lower()


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_notebook_runs_on_sim(path, record_property):
    nb, seconds = run_lab_notebook(path)
    record_property("seconds", round(seconds, 1))
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stream = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "record: " in stream, f"{path.name} printed no record line"
    assert seconds < LIMIT_S
    titles = figure_titles(nb)
    assert titles and all(titles), f"{path.name} shows an untitled figure: {titles}"
    assert "wb-quiz" in widget_classes(nb), f"{path.name} shows no quiz"
    assert_one_theme(nb, path.name)  # every figure in the chapters' colour scheme


def _widget_states(nb) -> list[dict]:
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    return [m.get("state", {}) for m in state.get("state", {}).values()]


def figure_titles(nb) -> list[str]:
    """The title of every plotly figure the run displayed: live (a FigureWidget's saved state)
    or static (the plotly mime bundle)."""
    out = [(s["_widget_layout"].get("title") or {}).get("text", "")
           for s in _widget_states(nb) if "_widget_layout" in s]
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            fig = o.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig:
                out.append((fig.get("layout", {}).get("title") or {}).get("text", ""))
    return out


def widget_classes(nb) -> set[str]:
    return {c for s in _widget_states(nb) for c in s.get("_dom_classes", [])}
