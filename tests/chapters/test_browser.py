"""A learner's path in a real browser: JupyterLab + Debian chromium driven by Playwright.

Opens chapter 02, runs all cells, waits for the page map to render, answers the first quiz
question and checks the feedback, and keeps screenshots in ``artifacts/browser/``. Skips only when
chromium is absent (``make browser-deps`` installs it). No browser is downloaded.
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

from .nbrun import CHAPTERS, ROOT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run"]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHAPTER = "02_elastic_memory"

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


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on 127.0.0.1 (free port, no token) over a copy of the chapters, so the
    committed notebooks never get outputs saved into them."""
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
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-InputArea-prompt')]"
                ".some(p => /\\[[0-9*]+\\]/.test(p.textContent))", timeout=20_000)
            return
        except Exception:  # noqa: BLE001 - nothing ran: try the menu again
            page.keyboard.press("Escape")
    raise AssertionError("Run All Cells never started a cell")


def _first_question() -> tuple[str, str]:
    """The right choice of Q1, found by its text: the learner's shuffle decides where it shows."""
    q = load_chapter_quiz(CHAPTER).questions[0]
    right = next(c for c in q.choices if c.correct)
    return right.text, right.feedback


@pytest.mark.timeout(300)
def test_chapter02_in_chromium(lab):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(run `make browser-deps` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    answer, feedback = _first_question()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{lab}/lab/tree/{CHAPTER}.ipynb", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
            _accept_kernel_dialog(page)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=90_000)
            _run_all(page)

            # The page map: a plotly figure inside the explorer, with its title and cells drawn.
            page.wait_for_selector(".wb-explorer .js-plotly-plot .main-svg", timeout=120_000)
            try:
                page.wait_for_function(
                    "() => [...document.querySelectorAll('.wb-explorer .js-plotly-plot .gtitle')]"
                    ".some(t => t.textContent.startsWith('Page map'))", timeout=60_000)
            except Exception:
                print("titles:", page.evaluate(
                    "() => [...document.querySelectorAll('.gtitle')].map(t => t.textContent)"))
                raise
            page.wait_for_selector(".wb-explorer .js-plotly-plot .hm image", state="attached",
                                   timeout=60_000)
            page.evaluate("document.querySelector('.wb-explorer').scrollIntoView({block: 'start'})")
            page.wait_for_timeout(1000)
            page.screenshot(path=str(ARTIFACTS / "chapter02.png"))

            # The quiz: answer the first question correctly and read the feedback.
            page.wait_for_selector(".wb-quiz .wb-quiz-question", timeout=120_000)
            card = page.locator(".wb-quiz .wb-quiz-question").first
            card.scroll_into_view_if_needed()
            card.locator("label", has_text=answer).first.click()
            card.locator(".wb-quiz-check").click()
            fb = card.locator(".wb-quiz-feedback")
            fb.get_by_text("Correct").wait_for(timeout=30_000)
            shown = fb.inner_text()
            assert "Correct" in shown and feedback[:40] in shown, shown
            score = page.locator(".wb-quiz-score").first.inner_text()
            assert score.startswith("Score 1 /"), score
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "chapter02_quiz.png"))
            errors = page.locator(".jp-OutputArea-output[data-mime-type="
                                  "'application/vnd.jupyter.stderr']").all_inner_texts()
            assert not [e for e in errors if "Traceback" in e], errors
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "chapter02_failure.png"))
            raise
        finally:
            browser.close()
