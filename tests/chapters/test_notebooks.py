"""Every chapter runs headless from top to bottom, within two minutes, and has its parts."""

from __future__ import annotations

import json

import pytest

nbformat = pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")

from workbench.quiz import quiz_names  # noqa: E402

from .nbrun import CHAPTERS, NOTEBOOKS, executed, run_ahead, run_notebook  # noqa: E402
from .theme import assert_one_theme  # noqa: E402

EXPECTED = ["00_start_here", "01_block_token_page", "02_elastic_memory",
            "03_prefix_ownership", "04_colocation_and_limits", "05_one_request",
            "06_tp_pp_transactions", "07_operating", "08_measuring_honestly",
            "09_beyond_one_kv_group", "10_beyond_hbm", "11_driver_layer"]
LIMIT_S = 120
ENV = {"WORKBENCH_SCORES": ""}  # a chapter's kernel keeps quiz scores in memory


def queue_notebook_runs(selected=()):
    """The headless runs of the notebooks among ``selected`` (by path or stem), queued as the
    session starts (tests/conftest.py)."""
    named = [p for p in NOTEBOOKS if p in selected or p.stem in selected]
    run_ahead(named, timeout=LIMIT_S, env=ENV)


def run_chapter(path):
    """The chapter's headless run, made once per session (the browser test opens the same)."""
    return executed(path, timeout=LIMIT_S, env=ENV)


def test_all_chapters_present():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_structure(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:  # committed without outputs
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name} has outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and 'backend = "sim"' in tagged[0].source
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for heading in ("## Summary", "## Exercises", "## Quiz"):
        assert heading in text, f"{path.name} lacks {heading}"
    assert f'show_quiz("{path.stem}")' in "\n".join(c.source for c in nb.cells)
    assert path.stem in quiz_names()


@pytest.mark.timeout(LIMIT_S + 60)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_executes_headless(path, no_score_file, record_property):
    nb, seconds = run_chapter(path)
    record_property("seconds", round(seconds, 1))
    print(f"{path.name}: {seconds:.1f} s")
    assert seconds < LIMIT_S
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    mimes = {m for c in nb.cells if c.cell_type == "code" for o in c.outputs
             for m in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" in mimes  # live plots and the quiz
    assert_one_theme(nb, path.name)  # every figure in the one colour scheme


@pytest.mark.timeout(LIMIT_S + 60)
def test_chapter_static_mode_renders_html(no_score_file):
    """WORKBENCH_VIZ=static: plain figures with an HTML rendering, so nbconvert shows them."""
    path = CHAPTERS / "02_elastic_memory.ipynb"
    nb, _ = run_notebook(path, timeout=LIMIT_S,
                         env={**ENV, "WORKBENCH_VIZ": "static"})
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("plotly" in h for h in html)
    assert sum(len(h) for h in html) < 8_000_000  # plotly.js (~4.6 MB) is embedded only once
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in outputs)
    quiz_text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Quiz: " in quiz_text
    json.dumps(nb)  # the executed notebook serialises (no stray objects)
