"""One lab notebook on a learner's path in a real browser (JupyterLab + Debian chromium driven
by Playwright, as tests/chapters/test_browser.py does for the chapters): run all cells, see its
titled figure, answer a quiz question by the text of its right choice, see the re-run panel."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")

from tests.chapters.test_browser import (  # noqa: E402
    ARTIFACTS,
    CHROMIUM,
    _free_port,
    _open_and_run,
    _see_main_figure,
    _settings,
    _shut_down_kernels,
)
from workbench.quiz.labbank import load_lab_quiz  # noqa: E402

from .test_lab_notebooks import ROOT  # noqa: E402

LAB = ("12_tp_pp", "TP=2: a map fails on")  # a sim lab that runs in under a second
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab over a copy of labs/ (the committed notebooks get no outputs)."""
    tmp = tmp_path_factory.mktemp("labs")
    work = tmp / "labs"
    shutil.copytree(ROOT / "labs", work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port = _free_port()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(_settings(tmp)),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               WORKBENCH_SCORES="", PYTHONPATH=os.pathsep.join(
                   p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    log = (tmp / "lab.log").open("w")
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
                raise RuntimeError("JupyterLab did not start:\n" + (tmp / "lab.log")
                                   .read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(run `make browser-deps` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.mark.timeout(360)
def test_lab_notebook_in_chromium(lab_server, browser):
    stem, title = LAB
    q = next(q for q in load_lab_quiz(stem).questions if q.kind == "single")
    right = next(c for c in q.choices if c.correct)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        _open_and_run(page, f"{lab_server}/lab/workspaces/lab{stem[:2]}/tree/{stem}.ipynb?reset")
        _see_main_figure(page, title)
        page.screenshot(path=str(ARTIFACTS / f"lab_{stem}.png"))
        page.wait_for_selector(".wb-lab-rerun", timeout=120_000)  # the re-run panel is live
        assert page.locator(".wb-lab-rerun", has_text="Run the lab").count() == 1
        page.wait_for_selector(".wb-quiz .wb-quiz-question", timeout=120_000)
        card = page.locator(".wb-quiz .wb-quiz-question", has_text=q.prompt[:50]).first
        card.scroll_into_view_if_needed()
        card.locator("label", has_text=right.text).first.click()
        card.locator(".wb-quiz-check").click()
        fb = card.locator(".wb-quiz-feedback")
        fb.get_by_text("Correct").wait_for(timeout=30_000)
        assert right.feedback[:40] in fb.inner_text()
        assert page.locator(".wb-quiz-score").first.inner_text().startswith("Score 1 /")
        errors = page.locator(".jp-OutputArea-output[data-mime-type="
                              "'application/vnd.jupyter.stderr']").all_inner_texts()
        assert not [e for e in errors if "Traceback" in e], errors
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"lab_{stem}_failure.png"))
        raise
    finally:
        _shut_down_kernels(page)
        page.close()
