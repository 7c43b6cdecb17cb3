"""A learner's browser, shared by the chapter and the lab browser tests: one JupyterLab server
over a copy of a notebook folder, Debian chromium driven by Playwright, and the steps a learner
takes (open, Run All, see a titled figure, answer a quiz question). No browser is downloaded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .nbrun import ROOT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run"]
ARTIFACTS = ROOT / "artifacts" / "browser"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_settings(root: Path) -> Path:
    """A fresh JupyterLab settings dir: no news/update toasts, every cell kept in the DOM, and
    widgets restored from a notebook's saved state (an executed notebook shows its live figures
    and quiz before any cell runs again)."""
    d = root / "lab-settings"
    for plugin, values in {
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                        "checkForUpdates": False},
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none",
                                                   "autoStartDefaultKernel": True},
        "@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": True},
    }.items():
        f = d / (plugin + ".jupyterlab-settings")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    return d


@contextlib.contextmanager
def jupyter_lab(folder: Path, tmp: Path) -> Iterator[tuple[str, Path]]:
    """One JupyterLab on 127.0.0.1 (free port, no token) over a copy of ``folder`` (so the
    committed notebooks never get outputs saved into them); yields (url, the copy). Kernels
    import this checkout's workbench."""
    work = tmp / folder.name
    shutil.copytree(folder, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(ROOT / "docs", tmp / "docs", dirs_exist_ok=True)  # the links into sources
    port = free_port()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(lab_settings(tmp)),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTER_DATA_DIR=str(tmp / "data"), WORKBENCH_SCORES="", PYTHONPATH=os.pathsep.join(
                   p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    log_path = tmp / "lab.log"
    log = log_path.open("w")
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
                raise RuntimeError("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
            time.sleep(0.5)
        yield url, work
    finally:
        proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def put_trusted(nb, path: Path, tmp: Path) -> None:
    """Write an executed notebook where :func:`jupyter_lab` (started over ``tmp``) serves it,
    signed with that server's key: JupyterLab renders an unsigned notebook's saved widgets and
    plotly figures as plain text, as it would a stranger's."""
    import nbformat
    from nbformat.sign import NotebookNotary

    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    NotebookNotary(data_dir=str(data)).sign(nb)
    nbformat.write(nb, path)


@contextlib.contextmanager
def chromium() -> Iterator:
    """Debian's chromium under Playwright (skips when it is not installed)."""
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(run `make browser-deps` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def accept_kernel_dialog(page, timeout_ms: int = 5_000) -> None:
    """Lab sometimes asks which kernel to start even though the notebook names one; accept the
    proposed (the notebook's) kernel."""
    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - no dialog: nothing to do
        return
    page.click(".jp-Dialog .jp-mod-accept")


def open_notebook(page, url: str, wait_idle: bool = True) -> None:
    """Open a notebook and (``wait_idle``) wait until its kernel is idle."""
    page.goto(url, timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
    if wait_idle:
        with contextlib.suppress(Exception):  # Lab may ask for the kernel first: answer it
            page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=5_000)
        wait_kernel_idle(page)


def wait_kernel_idle(page, timeout_s: float = 90) -> None:
    """Wait until the notebook's kernel is idle, accepting the kernel dialog whenever Lab shows
    one (it sometimes asks which kernel to start although the notebook names one)."""
    deadline = time.monotonic() + timeout_s
    idle = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
    while time.monotonic() < deadline:
        if page.locator(idle).count():
            return
        if page.locator(".jp-Dialog .jp-mod-accept").count():
            page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_timeout(200)
    raise AssertionError(f"the kernel was not idle within {timeout_s:.0f} s")


def run_menu(page, item: str) -> None:
    page.click("#jp-MainMenu .lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
    page.click(f".lm-Menu-itemLabel:text-is('{item}')", timeout=10_000)


def run_all(page, attempts: int = 3) -> None:
    """Run > Run All Cells from the menu bar, as a learner would; again if no cell finished
    within a minute (a click that lands before the kernel is connected is lost, and a cell
    queued as [*] behind a kernel that never started would wait for ever)."""
    for _ in range(attempts):
        run_menu(page, "Run All Cells")
        try:
            page.wait_for_function(  # in the shown notebook only
                "() => [...document.querySelectorAll("
                "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt')]"
                ".some(p => /\\[[0-9]+\\]/.test(p.textContent))", timeout=60_000)
            return
        except Exception:  # noqa: BLE001 - nothing finished: answer a dialog, try again
            page.keyboard.press("Escape")
            wait_kernel_idle(page)
    raise AssertionError("Run All Cells never finished a cell")


def open_and_run(page, url: str) -> None:
    open_notebook(page, url)
    run_all(page)


def rerun_quiz_cell(page) -> None:
    """Run the quiz cell (every notebook's last code cell) in place, in the live kernel, and wait
    for it: a notebook opened as its headless run left it gets a live quiz to answer."""
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").last
    before = cell.locator(".jp-InputArea-prompt").inner_text()
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    page.wait_for_function(
        "b => { const p = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden)"
        " .jp-CodeCell .jp-InputArea-prompt')].pop().textContent;"
        " return p !== b && /\\[[0-9]+\\]/.test(p); }", arg=before, timeout=90_000)


def see_figure(page, title: str, timeout_ms: int = 150_000) -> None:
    """Wait until a plotly figure titled ``title...`` has drawn, and scroll it into view."""
    js = ("t => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
          ".some(g => g.textContent.startsWith(t))")
    try:
        page.wait_for_function(js, arg=title, timeout=timeout_ms)
    except Exception:
        print("titles:", page.evaluate(
            "() => [...document.querySelectorAll('.gtitle')].map(t => t.textContent)"))
        raise
    assert page.locator(".js-plotly-plot .main-svg").count() > 0
    page.evaluate("t => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
                  ".find(g => g.textContent.startsWith(t)).closest('.js-plotly-plot')"
                  ".scrollIntoView({block: 'start'})", title)
    page.wait_for_timeout(300)


def answer_quiz(page, question) -> None:
    """Pick ``question``'s right choice by its text (the learner's shuffle decides where it
    shows), press Check, and see the right feedback and a score of 1."""
    right = next(c for c in question.choices if c.correct)
    page.wait_for_selector(".wb-quiz .wb-quiz-question", timeout=120_000)
    card = page.locator(".wb-quiz .wb-quiz-question", has_text=question.prompt[:50]).first
    card.scroll_into_view_if_needed()
    card.locator("label", has_text=right.text).first.click()
    card.locator(".wb-quiz-check").click()
    fb = card.locator(".wb-quiz-feedback")
    fb.get_by_text("Correct").wait_for(timeout=30_000)
    shown = fb.inner_text()
    assert "Correct" in shown and right.feedback[:40] in shown, shown
    score = page.locator(".wb-quiz-score").first.inner_text()
    assert score.startswith("Score 1 /"), score


def tracebacks(page) -> list[str]:
    errors = page.locator(".jp-OutputArea-output[data-mime-type="
                          "'application/vnd.jupyter.stderr']").all_inner_texts()
    return [e for e in errors if "Traceback" in e]


def shut_down_kernels(page) -> None:
    """Close every session, so the notebooks never hold many kernels at once (nothing to close
    on a page that never reached JupyterLab: the test's own error is the one to see)."""
    if not page.url.startswith("http"):
        return
    page.evaluate("""async () => {
        const x = document.cookie.match(/_xsrf=([^;]+)/);
        const h = x ? {'X-XSRFToken': decodeURIComponent(x[1])} : {};
        const s = await (await fetch('/api/sessions')).json();
        for (const t of s) await fetch('/api/sessions/' + t.id, {method: 'DELETE', headers: h});
    }""")
