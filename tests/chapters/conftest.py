"""Fixtures for the chapter tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_score_file(monkeypatch):
    """Quiz scores stay in memory (no ~/.workbench/scores.json from tests)."""
    monkeypatch.setenv("WORKBENCH_SCORES", "")
