"""Where chapters live and how to run one headless (nbclient, the venv's kernel)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
QUIZZES = sorted((ROOT / "workbench" / "quiz" / "data").glob("*.json"))  # with the package


def run_notebook(path: Path, *, timeout: int = 120, env: dict[str, str] | None = None):
    """Execute ``path`` in the venv's "workbench" kernel (python3 if that is missing), from the
    chapters folder as a learner would, ``env`` added to the kernel's environment only (this
    process's is not touched, so runs may go on in another thread); returns (notebook,
    seconds)."""
    return _execute(path, timeout, {**os.environ, **(env or {})})


def _execute(path: Path, timeout: int, kernel_env: dict[str, str]):
    import nbformat  # here, not at import: a bare GPU box collects the tests that use ROOT
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    names = KernelSpecManager().find_kernel_specs()
    kernel = "workbench" if "workbench" in names else "python3"
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=kernel_env)
    return nb, time.perf_counter() - t0


_RUNS: dict[Path, Future] = {}
_LOCK = threading.Lock()
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notebooks")  # one run at a time


def _submit(path: Path, timeout: int, env: dict[str, str] | None) -> Future:
    with _LOCK:
        if path not in _RUNS:
            # the environment as it is now: a test that sets a variable later changes no run
            _RUNS[path] = _WORKER.submit(_execute, path, timeout, {**os.environ, **(env or {})})
        return _RUNS[path]


def executed(path: Path, *, timeout: int = 120, env: dict[str, str] | None = None):
    """``run_notebook(path)`` once per test session: the headless test and the browser test of
    a notebook share one run (the browser opens the executed copy and only clicks)."""
    return _submit(path, timeout, env).result()


def run_ahead(paths, *, timeout: int = 120, env: dict[str, str] | None = None) -> None:
    """Queue the headless runs of ``paths``, one after another in the worker thread, so each
    runs while a browser test looks at the one before it (the kernel and the browser spend much
    of their time waiting on each other)."""
    for path in paths:
        _submit(path, timeout, env)


def cancel_pending() -> None:
    """Drop the queued runs that have not started (a session that stops early, ``-x`` or a
    selection, does not wait for a notebook no test will open)."""
    with _LOCK:
        for future in _RUNS.values():
            future.cancel()
