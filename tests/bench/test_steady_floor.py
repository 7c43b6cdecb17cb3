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
    assert cfg.kv_token_bytes == 2 * 32 * 8 * 128 * 2 == 131_072
    w = weight_bytes(cfg)
    assert w == 2 * (cfg.num_params - 128_256 * 4096)
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
