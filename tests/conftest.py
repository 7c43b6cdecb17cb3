"""Fixtures shared across test folders."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from workbench.transport.paths import SOCKET_DIR_ENV


@pytest.fixture
def socket_base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private socket directory for worker processes, removed after the test; modules that
    start workers use it with ``pytestmark = pytest.mark.usefixtures("socket_base")``."""
    base = tempfile.mkdtemp(prefix="wbkv-")  # short: socket paths stay under 107 bytes
    monkeypatch.setenv(SOCKET_DIR_ENV, os.path.join(base, "s"))
    yield Path(base, "s")
    shutil.rmtree(base, ignore_errors=True)


# The notebooks' headless runs are the suite's longest part, and each runs in a kernel (another
# process, the second core): they are queued as the session starts and the tests that open them
# run last, so the runs go on while the rest of the suite does. A test module that opens notebook
# runs says so with a ``queue_notebook_runs(selected)`` function (``selected``: the parameter
# values of its selected tests, so a narrow selection queues only the notebooks it opens).
def _queues(item: pytest.Item):
    return getattr(getattr(item, "module", None), "queue_notebook_runs", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    late = [item for item in items if _queues(item)]
    if late:
        items[:] = [item for item in items if not _queues(item)] + late


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    selected: dict = {}  # each module's queue -> the parameter values of its selected tests
    for item in session.items:  # after the selection (-m, -k), in run order
        queue = _queues(item)
        if queue:
            params = getattr(item, "callspec", None)
            selected.setdefault(queue, set()).update(params.params.values() if params else ())
    for queue, values in selected.items():
        queue(values)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.chapters.nbrun import cancel_pending

    cancel_pending()
