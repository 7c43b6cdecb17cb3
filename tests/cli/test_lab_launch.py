"""``workbench lab`` prints chapter 00's URL only once its own Jupyter answers there, refuses a
taken port in one line, and passes SIGTERM on to Jupyter: after it exits no process it started
(Jupyter, a kernel) is left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

pytest.importorskip("jupyterlab", reason="the notebook stack is not installed (make setup)")

from workbench.cli.lab import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    return dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
                JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
                JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), WORKBENCH_SCORES="",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _lab(tmp: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workbench", "lab", "--root", str(ROOT),
                             "--port", str(port), "--no-browser"], cwd=tmp, env=_env(tmp),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_a_taken_port_is_refused_in_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        proc = _lab(tmp_path, held.getsockname()[1])
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("error: port") and "Fix: pass --port" in err


@pytest.mark.timeout(180)
def test_url_after_bind_and_sigterm_leaves_no_process(tmp_path):
    port = free_port()
    proc = _lab(tmp_path, port)
    started: list[psutil.Process] = []
    try:
        url = None
        for line in proc.stderr:  # "starting ..." then the URL; Jupyter's log goes on after
            if line.startswith("chapter 00: "):
                url = line.split(": ", 1)[1].strip()
                break
        assert url, "workbench lab printed no URL"
        token = url.rsplit("token=", 1)[1]
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
            assert r.status == 200  # answering as soon as printed
        req = urllib.request.Request(f"{base}/api/kernels?token={token}", method="POST",
                                     data=json.dumps({"name": "workbench"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 201
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # jupyter and its kernel
            started = psutil.Process(proc.pid).children(recursive=True)
            if len(started) >= 2:
                break
            time.sleep(0.5)
        assert len(started) >= 2, started
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) is not None
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert alive == [], alive
    finally:
        for p in [*started, psutil.Process(proc.pid) if proc.poll() is None else None]:
            if p is not None and p.is_running():
                p.kill()
