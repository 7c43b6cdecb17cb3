"""A learner's path in a real browser: JupyterLab + Debian chromium driven by Playwright.

Opens every chapter (00-09) in one JupyterLab server, runs all its cells, waits for the chapter's
main figure (a plotly figure with a known title), answers one quiz question by the text of its
right choice and checks the feedback, and keeps one screenshot per chapter in
``artifacts/browser/NN_name.png``. Skips only when chromium is absent (``make browser-deps``
installs it). No browser is downloaded.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")

from workbench.quiz import load_chapter_quiz  # noqa: E402

from .browser import (  # noqa: E402
    ARTIFACTS,
    answer_quiz,
    chromium,
    jupyter_lab,
    open_and_run,
    see_figure,
    shut_down_kernels,
    tracebacks,
)
from .nbrun import CHAPTERS, NOTEBOOKS  # noqa: E402

# Each chapter's main figure: the start of its plotly title (a stable string the chapter sets).
MAIN_FIGURE = {
    "00_start_here": "Page map",
    "01_block_token_page": "One request:",
    "02_elastic_memory": "Page map",
    "03_prefix_ownership": "Page map",
    "04_colocation_and_limits": "Page map",
    "05_one_request": "vLLM: EngineCore decides",
    "06_tp_pp_transactions": "alloc then free",
    "07_operating": "Failure decision tree",
    "08_measuring_honestly": "TTFT of every request",
    "09_beyond_one_kv_group": "Blocks held per group",
    "10_beyond_hbm": "PD: where each request",
}

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab for every chapter, over a copy of the chapters."""
    with jupyter_lab(CHAPTERS, tmp_path_factory.mktemp("lab")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _question(stem: str):
    """The chapter's first single-choice question."""
    return next(q for q in load_chapter_quiz(stem).questions if q.kind == "single")


def test_every_chapter_has_a_main_figure():
    assert sorted(MAIN_FIGURE) == [p.stem for p in NOTEBOOKS]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("stem", sorted(MAIN_FIGURE))
def test_chapter_in_chromium(lab, browser, stem):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    shot = ARTIFACTS / f"{stem}.png"
    t0 = time.monotonic()
    try:
        # a fresh workspace per chapter: only this notebook is open, no tab of the last one
        open_and_run(page, f"{lab}/lab/workspaces/ch{stem[:2]}/tree/{stem}.ipynb?reset")
        see_figure(page, MAIN_FIGURE[stem])
        page.screenshot(path=str(shot))
        answer_quiz(page, _question(stem))
        assert tracebacks(page) == []
        print(f"{stem}: {time.monotonic() - t0:.0f} s in chromium")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{stem}_failure.png"))
        raise
    finally:
        shut_down_kernels(page)
        page.close()
