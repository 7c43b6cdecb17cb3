"""``workbench lab``: open JupyterLab on the chapters (what ``make lab`` runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from workbench.cli import app


@app.command()
def lab(chapters: Path = typer.Option(Path("chapters"), help="Folder of the chapters."),
        port: int = typer.Option(8888, help="Port for JupyterLab on 127.0.0.1.")) -> None:
    """Open JupyterLab on the chapters (sim backend by default)."""
    # the venv's own jupyter first: `make lab` runs us from there
    here = Path(sys.executable).with_name("jupyter")
    exe = str(here) if here.exists() else shutil.which("jupyter")
    if exe is None:
        typer.echo("jupyter is not installed here: run `make lab`, which sets it up.", err=True)
        raise typer.Exit(2)
    start = chapters / "00_start_here.ipynb"
    args = [exe, "lab", f"--notebook-dir={chapters}", "--ip=127.0.0.1", f"--port={port}"]
    if os.geteuid() == 0:  # containers and CI boxes run as root; Jupyter refuses without this
        args.append("--allow-root")
    raise typer.Exit(subprocess.call(args + ([str(start)] if start.exists() else [])))
