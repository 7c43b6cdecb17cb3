"""Every lab notebook on a learner's path in a real browser (JupyterLab + Debian chromium driven by
Playwright, the helpers of tests/chapters/browser.py).

One lab (``FULL_RUN``) is run end to end in the browser: Run All, its titled figure drawn, the
re-run panel live, a quiz question answered. Every lab notebook is then opened as its headless
run left it (the same run tests/labs/test_lab_notebooks.py checks, made once per session): each
of its titled figures is drawn from the saved outputs, its re-run panel shows, and its quiz cell
is run again in the notebook's kernel and a question answered by the text of its right choice
(``make test`` opens ``FIRST_OPENED`` so; ``make test-browser`` every lab).
So the browser costs a page load, a kernel start and a click per lab, not a second run of each
(a kernel shared by the labs was tried: a warm kernel connects before the saved widgets are
restored, and JupyterLab then shows some of them as "model not found").
"""

from __future__ import annotations

import copy
import json
import time

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")

from tests.chapters.browser import (  # noqa: E402
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
from tests.chapters.nbrun import run_ahead  # noqa: E402
from workbench.quiz.labbank import load_lab_quiz  # noqa: E402

from .test_lab_notebooks import (  # noqa: E402
    LIMIT_S,
    NOTEBOOKS,
    ROOT,
    figure_titles,
    lab_env,
    queue_notebook_runs,  # noqa: F401 - tests/conftest.py queues the runs by it
    run_lab_notebook,
)

FULL_RUN = ("12_tp_pp", "TP=2: a map fails on")  # a sim lab that runs in under a second
FIRST_OPENED = "00_colocation"  # the headline lab, the one ``make test`` opens as saved
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab over a copy of labs/ (the committed notebooks get no outputs)."""
    tmp = tmp_path_factory.mktemp("labs")
    run_ahead(NOTEBOOKS, timeout=LIMIT_S, env=lab_env())  # the headless runs the tests open
    with jupyter_lab(ROOT / "labs", tmp) as (url, work):
        yield url, work, tmp


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _single(stem: str):
    return next(q for q in load_lab_quiz(stem).questions if q.kind == "single")


@pytest.mark.timeout(360)
def test_lab_notebook_runs_in_chromium(lab_server, browser):
    url, _, _ = lab_server
    stem, title = FULL_RUN
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        open_and_run(page, f"{url}/lab/workspaces/lab{stem[:2]}/tree/{stem}.ipynb?reset")
        see_figure(page, title)
        page.screenshot(path=str(ARTIFACTS / f"lab_{stem}.png"))
        page.wait_for_selector(".wb-lab-rerun", timeout=120_000)  # the re-run panel is live
        assert page.locator(".wb-lab-rerun", has_text="Run the lab").count() == 1
        answer_quiz(page, _single(stem))
        assert tracebacks(page) == []
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"lab_{stem}_failure.png"))
        raise
    finally:
        shut_down_kernels(page)
        page.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", [p if p.stem == FIRST_OPENED else
                                  pytest.param(p, marks=pytest.mark.every_notebook)
                                  for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_executed_lab_notebook_in_chromium(lab_server, browser, path):
    url, work, tmp = lab_server
    nb, _ = run_lab_notebook(path)  # the headless run (made here if it has not been yet)
    titles = [t for t in figure_titles(nb) if t]
    assert titles, f"{path.name} shows no titled figure"
    put_trusted(copy.deepcopy(nb), work / path.name, tmp)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    t0 = time.monotonic()
    try:
        # the saved figures draw while the kernel starts
        open_notebook(page, f"{url}/lab/workspaces/x{path.stem[:2]}/tree/{path.name}?reset",
                      wait_idle=False)
        for i, title in enumerate(titles):  # every figure drawn from the saved run
            # the first waits for JupyterLab to lay the notebook out (79 s once, on a loaded
            # CI host, with every figure drawn just after 60 s); the rest draw with it
            see_figure(page, title.split("<")[0][:40], timeout_ms=150_000 if i == 0 else 60_000)
        t1 = time.monotonic()
        page.screenshot(path=str(ARTIFACTS / f"lab_{path.stem}.png"))
        if "RerunPanel(" in json.dumps(nb.cells):
            assert page.locator(".wb-lab-rerun", has_text="Run the lab").count() == 1
        wait_kernel_idle(page)
        t2 = time.monotonic()
        rerun_quiz_cell(page)
        answer_quiz(page, _single(path.stem))
        assert tracebacks(page) == []
        t3 = time.monotonic()
        print(f"{path.stem}: {t3 - t0:.1f} s in chromium (figures {t1 - t0:.1f}, kernel "
              f"{t2 - t1:.1f}, quiz {t3 - t2:.1f})")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"lab_{path.stem}_failure.png"))
        raise
    finally:
        shut_down_kernels(page)
        page.close()
