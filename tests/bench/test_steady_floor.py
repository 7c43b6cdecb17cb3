"""The steady-decode bench's bandwidth floor and spread, from the geometry alone."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.bench.steady import (  # noqa: E402
    COPY_BYTES_PER_S,
    floor_bytes,
    floor_seconds,
    spread,
    weight_bytes,
)
from workbench.mini.model import get_config  # noqa: E402


def test_llama_8b_floor_at_batch_128_and_1024_tokens_of_context():
    cfg = get_config("llama-3.1-8b")
    assert cfg.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    w = weight_bytes(cfg)
    assert w == 2 * (cfg.params - 128_256 * 4096)
    ctx = 128 * 1024
    want = w + 2 * 128 * 4096 + (ctx + 128) * 131_072 + 128 * 131_072
    assert floor_bytes(cfg, 128, ctx) == want
    assert floor_seconds(cfg, 128, ctx) == want / 4.3e12 == want / COPY_BYTES_PER_S


@given(st.lists(st.floats(0.001, 10.0), min_size=2, max_size=40))
def test_spread_brackets_the_median(xs):
    s = spread(xs)
    assert s["n"] == len(xs)
    eps = 1e-9 * max(xs)  # the deciles interpolate: allow their rounding
    assert min(xs) - eps <= s["p10"] <= s["median"] + eps
    assert s["median"] - eps <= s["p90"] <= max(xs) + eps


def test_spread_of_nothing_and_of_one():
    assert spread([]) == {"median": None, "p10": None, "p90": None, "n": 0}
    assert spread([2.5]) == {"median": 2.5, "p10": 2.5, "p90": 2.5, "n": 1}


class _FakeEngine:
    """Records the global order of steps and whether graphs were on for each."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log
        self.graphs = type("G", (), {"enabled": True})()
        self.stats = type("S", (), {"steps": []})()

    def step(self):
        self.log.append((self.name, self.graphs.enabled))
        self.stats.steps.append(len(self.log))


def test_turns_alternate_vmm_and_static_step_by_step_in_abba_order():
    from workbench.bench.steady import _turns

    log: list = []
    a, b = _FakeEngine("vmm", log), _FakeEngine("static", log)
    got = _turns([(a, False), (b, False)], 4, flip=False)
    assert [n for n, _ in log] == ["vmm", "static", "static", "vmm"] * 2
    assert all(g is False for _, g in log)
    assert got == [[1, 4, 5, 8], [2, 3, 6, 7]]  # each subject's own steps, in its order
    log.clear()
    _turns([(a, True), (b, True)], 2, flip=True)
    assert log == [("static", True), ("vmm", True), ("vmm", True), ("static", True)]


def test_modes_pair_vmm_with_static_of_the_same_style_and_graphs():
    from workbench.bench.steady import SUBJECTS, _modes

    assert _modes(list(SUBJECTS)) == [
        [("vmm", "block", True), ("static", "block", True)],
        [("vmm", "block", False), ("static", "block", False)],
        [("vmm", "token", True)]]
