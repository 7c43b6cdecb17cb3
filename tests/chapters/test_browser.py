"""A learner's path in a real browser: JupyterLab + Debian chromium driven by Playwright.

One chapter (``FULL_RUN``) is run end to end in one JupyterLab server: all its cells run, its main
figure (a plotly figure with a known title) drawn, one quiz question answered by the text of its
right choice and the feedback checked. Every other chapter is opened as its headless run left it
(tests/chapters/test_notebooks.py checks that run; it is made once per session): its main figure
drawn from the saved outputs, its quiz cell run again in the notebook's live kernel and a
question answered. One screenshot per chapter goes to ``artifacts/browser/NN_name.png``. Skips
only when chromium is absent (``make browser-deps`` installs it). No browser is downloaded.
``make test`` opens chapters 00 and ``FULL_RUN`` (every chapter's headless run is checked there
all the same); ``make test-browser`` opens every chapter.
"""

from __future__ import annotations

import copy
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
    open_notebook,
    put_trusted,
    rerun_quiz_cell,
    see_figure,
    shut_down_kernels,
    tracebacks,
    wait_kernel_idle,
)
from .nbrun import CHAPTERS, NOTEBOOKS, run_ahead  # noqa: E402
from .test_notebooks import (  # noqa: E402
    ENV,
    LIMIT_S,
    queue_notebook_runs,  # noqa: F401 - tests/conftest.py queues the runs by it
    run_chapter,
)

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
    "11_driver_layer": "Four pages of address space",
}

FULL_RUN = "02_elastic_memory"  # the chapter a learner runs first after chapter 00's tour
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab for every chapter, over a copy of the chapters."""
    tmp = tmp_path_factory.mktemp("lab")
    run_ahead(NOTEBOOKS, timeout=LIMIT_S, env=ENV)  # the headless runs the tests open
    with jupyter_lab(CHAPTERS, tmp) as (url, work):
        yield url, work, tmp


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _question(stem: str):
    """The chapter's first single-choice question."""
    return next(q for q in load_chapter_quiz(stem).questions if q.kind == "single")


def test_every_chapter_has_a_main_figure():
    assert sorted(MAIN_FIGURE) == [p.stem for p in NOTEBOOKS]


# ``make test`` opens the chapters a learner opens first; ``make test-browser`` opens every one
FIRST_OPENED = ("00_start_here", FULL_RUN)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("stem", [s if s in FIRST_OPENED else
                                  pytest.param(s, marks=pytest.mark.every_notebook)
                                  for s in sorted(MAIN_FIGURE)])
def test_chapter_in_chromium(lab, browser, stem, no_score_file):
    url, work, tmp = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    shot = ARTIFACTS / f"{stem}.png"
    at = f"{url}/lab/workspaces/ch{stem[:2]}/tree/{stem}.ipynb?reset"  # only this notebook open
    t0 = time.monotonic()
    try:
        if stem == FULL_RUN:
            open_and_run(page, at)
            see_figure(page, MAIN_FIGURE[stem])
            page.screenshot(path=str(shot))
        else:
            nb, _ = run_chapter(CHAPTERS / f"{stem}.ipynb")
            put_trusted(copy.deepcopy(nb), work / f"{stem}.ipynb", tmp)
            open_notebook(page, at, wait_idle=False)  # the saved figures draw as the kernel starts
            see_figure(page, MAIN_FIGURE[stem])
            page.screenshot(path=str(shot))
            wait_kernel_idle(page)
            rerun_quiz_cell(page)
        answer_quiz(page, _question(stem))
        assert tracebacks(page) == []
        print(f"{stem}: {time.monotonic() - t0:.0f} s in chromium")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{stem}_failure.png"))
        raise
    finally:
        shut_down_kernels(page)
        page.close()
