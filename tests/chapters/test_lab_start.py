"""``workbench lab`` (what ``make lab`` runs) as a newcomer meets it, in a real browser.

Starts ``python -m workbench lab`` headless on a free port with fresh Jupyter settings and
workspaces, takes the URL it prints, opens it in Debian chromium and checks: chapter 00 is the
open document (no Launcher), no news or update toast, one kernel offered, and a lab link in
chapter 00 opens that lab. Screenshots in ``artifacts/lab/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .nbrun import ROOT

pytest.importorskip("jupyterlab", reason="the notebook stack is not installed (make setup)")

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--no-first-run"]
ARTIFACTS = ROOT / "artifacts" / "lab"
LAB_LINK = "10 no fake enable"  # the text of chapter 00's link to ../labs/10_no_fake_enable.ipynb

pytestmark = pytest.mark.browser


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    """The URL ``workbench lab`` prints, while its server runs (a fresh user's Jupyter dirs)."""
    tmp = tmp_path_factory.mktemp("lab-start")
    # a fresh user's settings, but autosave off: the test never writes into the chapters
    autosave = (tmp / "settings" / "@jupyterlab" / "docmanager-extension"
                / "plugin.jupyterlab-settings")
    autosave.parent.mkdir(parents=True)
    autosave.write_text(json.dumps({"autosave": False}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), WORKBENCH_SCORES="",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = (tmp / "lab.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "lab", "--root", str(ROOT),
                             "--port", str(_free_port()), "--no-browser"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url, deadline = None, time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            text = (tmp / "lab.log").read_text()
            url = url or next((ln.split(": ", 1)[1] for ln in text.splitlines()
                               if ln.startswith("chapter 00: ")), None)
            if url and "is running at" in text:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("workbench lab did not start:\n" + (tmp / "lab.log").read_text())
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_printed_url_is_chapter_00(lab_url):
    assert "/lab/tree/chapters/00_start_here.ipynb?token=" in lab_url
    base, token = lab_url.split("/lab/", 1)[0], lab_url.rsplit("token=", 1)[1]
    with urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=10) as r:
        specs = json.load(r)
    assert list(specs["kernelspecs"]) == ["workbench"] and specs["default"] == "workbench"
    for path in ("labs/10_no_fake_enable.ipynb", "labs/README.md", "docs/structures.md"):
        with urllib.request.urlopen(f"{base}/api/contents/{path}?content=0&token={token}",
                                    timeout=10) as r:
            assert r.status == 200, path


@pytest.fixture(scope="module")
def page(lab_url):
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium "
                    "(run `make browser-deps` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        pg = b.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(lab_url, timeout=90_000)
        yield pg
        b.close()


def _active_tab(page) -> str:
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current "
                        ".lm-TabBar-tabLabel").first.inner_text()


@pytest.mark.timeout(300)
def test_opens_on_chapter_00_without_toasts(page):
    try:
        page.wait_for_selector(".jp-NotebookPanel .jp-MarkdownCell", timeout=90_000)
        page.wait_for_timeout(3000)  # toasts come a moment after the page
        assert _active_tab(page) == "00_start_here.ipynb"
        assert page.locator(".jp-Launcher:visible").count() == 0
        toasts = page.locator(".Toastify__toast").all_inner_texts()
        assert not toasts, toasts
        page.screenshot(path=str(ARTIFACTS / "00_start_here.png"))
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "00_start_here_failure.png"))
        raise


@pytest.mark.timeout(300)
def test_lab_link_opens_the_lab(page):
    link = page.locator(f".jp-NotebookPanel a:text-is('{LAB_LINK}')").first
    try:
        for _ in range(60):  # cells far down render as they scroll into view
            if link.count():
                break
            page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer").first.evaluate(
                "el => el.scrollBy(0, 300)")
            page.wait_for_timeout(250)
        link.scroll_into_view_if_needed()
        link.click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('.lm-TabBar-tab.lm-mod-current "
            ".lm-TabBar-tabLabel')].some(t => t.textContent === '10_no_fake_enable.ipynb')",
            timeout=60_000)
        page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownCell",
                               timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "10_no_fake_enable_from_00.png"))
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "lab_link_failure.png"))
        raise
