"""Where chapters live and how to run one headless (nbclient, the venv's kernel)."""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
QUIZZES = sorted((ROOT / "workbench" / "quiz" / "data").glob("*.json"))  # with the package


def run_notebook(path: Path, *, timeout: int = 120, env: dict[str, str] | None = None):
    """Execute ``path`` in the venv's "workbench" kernel (python3 if that is missing), from the
    chapters folder as a learner would; returns (notebook, seconds)."""
    import nbformat  # here, not at import: a bare GPU box collects the tests that use ROOT
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    names = KernelSpecManager().find_kernel_specs()
    kernel = "workbench" if "workbench" in names else "python3"
    nb = nbformat.read(path, as_version=4)
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        return nb, time.perf_counter() - t0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v




_EXECUTED: dict[Path, tuple[object, float]] = {}


def executed(path: Path, *, timeout: int = 120, env: dict[str, str] | None = None):
    """``run_notebook(path)`` once per test session: the headless test and the browser test of
    a notebook share one run (the browser opens the executed copy and only clicks)."""
    if path not in _EXECUTED:
        _EXECUTED[path] = run_notebook(path, timeout=timeout, env=env)
    return _EXECUTED[path]
