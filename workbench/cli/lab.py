"""``workbench lab``: JupyterLab on the repository, opening chapter 00 (what ``make lab`` runs).

Rooted at the repository (not ``chapters/``) so chapter 00's ``../labs/`` links and the docs open;
the URL printed (and opened) is chapter 00 itself. Jupyter's news and update toasts are off
(``lab_settings/overrides.json`` and ``news_url=None``), and only the ``workbench`` kernel every
notebook names is offered (ipykernel's own ``python3`` spec is the same interpreter twice).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

from workbench.cli.root import app

START = "chapters/00_start_here.ipynb"
KERNEL = "workbench"
SETTINGS = Path(__file__).with_name("lab_settings")


def find_root(start: Path) -> Path | None:
    """The repository holding ``chapters/00_start_here.ipynb``: ``start`` or a folder above it,
    else the checkout this package was installed from (``pip install -e``)."""
    for d in (start, *start.parents, Path(__file__).resolve().parents[2]):
        if (d / START).is_file():
            return d
    return None


def lab_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/lab/tree/{START}?token={token}"


def lab_args(exe: str, root: Path, port: int, token: str, browser: bool) -> list[str]:
    """The ``jupyter lab`` command line: rooted at ``root``, chapter 00 as the default page."""
    args = [exe, "lab", f"--ServerApp.root_dir={root}", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.default_url=/lab/tree/{START}",
            f"--LabApp.default_url=/lab/tree/{START}",
            f"--LabApp.app_settings_dir={SETTINGS}", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--KernelSpecManager.allowed_kernelspecs={KERNEL}",
            "--KernelSpecManager.ensure_native_kernel=False",
            f"--MappingKernelManager.default_kernel_name={KERNEL}"]
    if not browser:
        args.append("--no-browser")
    if os.geteuid() == 0:  # containers and CI boxes run as root; Jupyter refuses without this
        args.append("--allow-root")
    return args


def _ensure_kernel(exe: str) -> None:
    """Register the ``workbench`` kernel in this environment when it is missing (``make lab``
    registers it; a plain ``pip install`` does not)."""
    found = subprocess.run([exe, "kernelspec", "list"], capture_output=True, text=True).stdout
    if not any(line.split()[:1] == [KERNEL] for line in found.splitlines()):
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name",
                        KERNEL, "--display-name", "Python (workbench)"], check=False,
                       stdout=subprocess.DEVNULL)


@app.command(short_help='JupyterLab on the repository, at chapter 00.')
def lab(root: Path | None = typer.Option(
            None, help="Repository folder (holding chapters/). Default: found from here."),
        port: int = typer.Option(8888, help="Port for JupyterLab on 127.0.0.1."),
        no_browser: bool = typer.Option(False, "--no-browser",
                                        help="Do not open a web browser.")) -> None:
    """Open JupyterLab on the repository at chapter 00 (sim backend by default)."""
    # the venv's own jupyter first: `make lab` runs us from there
    here = Path(sys.executable).with_name("jupyter")
    exe = str(here) if here.exists() else shutil.which("jupyter")
    if exe is None:
        typer.echo("error: jupyter is not installed here, and `workbench lab` runs it. "
                   "Fix: run `make lab`, or pip install 'kv-cache-workbench[lab]'.", err=True)
        raise typer.Exit(2)
    top = find_root((root or Path.cwd()).resolve())
    if top is None:
        typer.echo(f"error: no {START} under {root or Path.cwd()}: `workbench lab` opens the "
                   "chapters of a checkout. Fix: run it in the repository, or pass --root.",
                   err=True)
        raise typer.Exit(2)
    if not port_free(port):
        typer.echo(f"error: port {port} on 127.0.0.1 is taken (another server answers there). "
                   f"Fix: pass --port {free_port()}, or stop what listens on {port}.", err=True)
        raise typer.Exit(2)
    _ensure_kernel(exe)
    token = secrets.token_hex(16)
    typer.echo("starting JupyterLab ...", err=True)
    raise typer.Exit(run_jupyter(lab_args(exe, top, port, token, not no_browser), top, port,
                                 token))


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int, token: str) -> bool:
    """Our Jupyter is up: the port answers its status with our token (another server would
    refuse the token)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}",
                                    timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def run_jupyter(args: list[str], cwd: Path, port: int, token: str) -> int:
    """Run Jupyter; print chapter 00's URL once this Jupyter answers on ``port`` with ``token``
    (never before: a port taken meanwhile would name another server). SIGTERM and SIGHUP go on
    to Jupyter, which shuts its kernels down; Ctrl-C reaches it from the terminal. Returns its
    exit code."""
    proc = subprocess.Popen(args, cwd=cwd)

    def forward(signum, _frame):  # noqa: ANN001 - signal's signature
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter asks, then shuts down itself
    while proc.poll() is None and not _answers(port, token):
        time.sleep(0.3)
    if proc.poll() is None:
        typer.echo(f"chapter 00: {lab_url(port, token)}", err=True)
    return proc.wait()
