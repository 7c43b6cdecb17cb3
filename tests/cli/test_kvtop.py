"""``kvtop`` fits its width (a terminal's, or COLUMNS when piped), marks the limit under the
bar column where it falls, tells used from reserved by glyph as well as colour, and quits on q."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.pool_owner import spawn_owner
from workbench.cli.kvtop import BAR, _bar, column, fit, limit_mark
from workbench.core import control


@given(st.integers(1, 200), st.integers(0, 10**6), st.integers(1, 10**6))
def test_the_limit_mark_sits_at_the_limit_column(width, limit, extra):
    total = limit + extra - 1 if limit + extra > 1 else 1
    limit = min(limit, total)
    text = limit_mark(limit, total, width).plain
    assert len(text) <= width
    assert text.index("▲") == min(width - 1, column(limit, total, width))


@given(st.integers(1, 200), st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000))
def test_the_bar_is_its_width_and_used_differs_from_reserved(width, used, reserved, free):
    total = used + reserved + free or 1
    text = _bar(used, reserved, total, width).plain
    assert len(text) == width
    assert text.count(BAR["used"][0]) == column(used, total, width)
    assert text.count(BAR["used"][0]) + text.count(BAR["reserved"][0]) == \
        column(used + reserved, total, width)
    assert len({g for g, _ in BAR.values()}) == 3


def test_fit_keeps_the_panel_inside_the_columns():
    assert fit(64, 200) == 64 and fit(64, 40) == 36 and fit(64, 3) == 1


@pytest.fixture
def owner():
    name = f"t_{uuid.uuid4().hex[:10]}"
    p = spawn_owner(name)
    assert p.stdout.readline().strip() == "ready"
    yield name
    p.stdin.write("quit\n")
    p.stdin.flush()
    p.wait(timeout=30)
    control.segment_path(name).unlink(missing_ok=True)


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, **extra)


def test_piped_once_honours_columns(owner):
    r = subprocess.run([sys.executable, "-m", "workbench", "kvtop", "--once"],
                       capture_output=True, text=True, timeout=60, env=_env(COLUMNS="50"))
    assert r.returncode == 0, r.stderr
    assert owner in r.stdout and BAR["used"][0] in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 50


@pytest.mark.timeout(60)
def test_q_quits_the_live_view(owner):
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "kvtop", "--interval", "0.2"],
                            stdin=sub, stdout=sub, stderr=sub, env=_env(COLUMNS="80"),
                            close_fds=True)
    os.close(sub)
    try:
        seen, deadline = b"", time.monotonic() + 30
        while owner.encode() not in seen and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                seen += os.read(main, 65536)
        assert owner.encode() in seen, seen[-500:]
        os.write(main, b"q")
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 10:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    os.read(main, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
