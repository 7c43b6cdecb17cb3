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
