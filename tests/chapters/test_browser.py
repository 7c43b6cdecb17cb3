"""A learner's path in a real browser: JupyterLab + Debian chromium driven by Playwright.

Opens every chapter (00-09) in one JupyterLab server, runs all its cells, waits for the chapter's
main figure (a plotly figure with a known title), answers one quiz question by the text of its
right choice and checks the feedback, and keeps one screenshot per chapter in
``artifacts/browser/NN_name.png``. Skips only when chromium is absent (``make browser-deps``
installs it). No browser is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")

from workbench.quiz import load_chapter_quiz

from .nbrun import CHAPTERS, NOTEBOOKS, ROOT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run"]
ARTIFACTS = ROOT / "artifacts" / "browser"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(root: Path) -> Path:
    """A fresh JupyterLab settings dir: no news/update toasts, every cell kept in the DOM."""
    d = root / "lab-settings"
    for plugin, values in {
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                        "checkForUpdates": False},
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none",
                                                   "autoStartDefaultKernel": True},
    }.items():
        f = d / (plugin + ".jupyterlab-settings")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    return d


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """One JupyterLab on 127.0.0.1 (free port, no token) for every chapter, over a copy of the
    chapters, so the committed notebooks never get outputs saved into them."""
    tmp_path = tmp_path_factory.mktemp("lab")
    work = tmp_path / "chapters"
    shutil.copytree(CHAPTERS, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port = _free_port()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(_settings(tmp_path)),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), WORKBENCH_SCORES="")
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={work}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not start:\n" + (tmp_path / "lab.log")
                                   .read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _accept_kernel_dialog(page) -> None:
    """Lab sometimes asks which kernel to start even though the notebook names one; accept the
    proposed (the notebook's) kernel."""
    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=5_000)
    except Exception:  # noqa: BLE001 - no dialog: nothing to do
        return
    page.click(".jp-Dialog .jp-mod-accept")


def _run_all(page, attempts: int = 3) -> None:
    """Run > Run All Cells from the menu bar, as a learner would; again if no cell started
    (a click that lands before the kernel is connected is lost)."""
    for _ in range(attempts):
        page.click("#jp-MainMenu .lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')", timeout=10_000)
        try:
            page.wait_for_function(  # in the shown notebook only
                "() => [...document.querySelectorAll("
                "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
                ".some(p => /\\[[0-9*]+\\]/.test(p.textContent))", timeout=20_000)
            return
        except Exception:  # noqa: BLE001 - nothing ran: try the menu again
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells never started a cell")


def _question(stem: str) -> tuple[str, str, str]:
    """The chapter's first single-choice question: its prompt, and its right choice's text and
    feedback, found by text (the learner's shuffle decides where the choice shows)."""
    q = next(q for q in load_chapter_quiz(stem).questions if q.kind == "single")
    right = next(c for c in q.choices if c.correct)
    return q.prompt, right.text, right.feedback


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(run `make browser-deps` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield b
        b.close()


def _open_and_run(page, url: str) -> None:
    page.goto(url, timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
    _accept_kernel_dialog(page)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=90_000)
    _run_all(page)


def _see_main_figure(page, title: str) -> None:
    """Wait until a plotly figure titled ``title...`` has drawn, and scroll it into view."""
    js = ("t => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
          ".some(g => g.textContent.startsWith(t))")
    try:
        page.wait_for_function(js, arg=title, timeout=150_000)
    except Exception:
        print("titles:", page.evaluate(
            "() => [...document.querySelectorAll('.gtitle')].map(t => t.textContent)"))
        raise
    assert page.locator(".js-plotly-plot .main-svg").count() > 0
    page.evaluate("t => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                  ".find(g => g.textContent.startsWith(t)).closest('.js-plotly-plot')"
                  ".scrollIntoView({block: 'start'})", title)
    page.wait_for_timeout(1000)


def _answer(page, stem: str) -> None:
    prompt, answer, feedback = _question(stem)
    page.wait_for_selector(".wb-quiz .wb-quiz-question", timeout=120_000)
    card = page.locator(".wb-quiz .wb-quiz-question", has_text=prompt[:50]).first
    card.scroll_into_view_if_needed()
    card.locator("label", has_text=answer).first.click()
    card.locator(".wb-quiz-check").click()
    fb = card.locator(".wb-quiz-feedback")
    fb.get_by_text("Correct").wait_for(timeout=30_000)
    shown = fb.inner_text()
    assert "Correct" in shown and feedback[:40] in shown, shown
    score = page.locator(".wb-quiz-score").first.inner_text()
    assert score.startswith("Score 1 /"), score


def _shut_down_kernels(page) -> None:
    """Close every session, so ten chapters never hold ten kernels at once."""
    page.evaluate("""async () => {
        const x = document.cookie.match(/_xsrf=([^;]+)/);
        const h = x ? {'X-XSRFToken': decodeURIComponent(x[1])} : {};
        const s = await (await fetch('/api/sessions')).json();
        for (const t of s) await fetch('/api/sessions/' + t.id, {method: 'DELETE', headers: h});
    }""")


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
        _open_and_run(page, f"{lab}/lab/workspaces/ch{stem[:2]}/tree/{stem}.ipynb?reset")
        _see_main_figure(page, MAIN_FIGURE[stem])
        page.screenshot(path=str(shot))
        _answer(page, stem)
        errors = page.locator(".jp-OutputArea-output[data-mime-type="
                              "'application/vnd.jupyter.stderr']").all_inner_texts()
        assert not [e for e in errors if "Traceback" in e], errors
        print(f"{stem}: {time.monotonic() - t0:.0f} s in chromium")
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{stem}_failure.png"))
        raise
    finally:
        _shut_down_kernels(page)
        page.close()
