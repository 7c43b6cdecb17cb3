"""The tier connector on the simulated vLLM-like engine: loaded tokens skip prefill compute and
put their load time on the admitting step; the local (HBM) hit is never loaded again; the prompt
is saved once its prefill is done, its device-to-host copy on the next step; without a connector
nothing changes."""

from __future__ import annotations

import math

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engines.models import get_model
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sched.scheduler import attn_pairs
from workbench.engines.sim.kvsetup import static_pool
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.tiers import TierCosts, make_stack
from workbench.tiers.sim import TierConnector

MODEL = "llama-3.1-8b"
ST = StepTimeModel.preset(MODEL, "a100")
C = TierCosts(chunk_tokens=64)


def engine(conn: TierConnector | None, apc: bool = False):
    env = simpy.Environment()
    e = VLLMLikeEngine(env, "e", static_pool(get_model(MODEL), 8 << 30, name="e"), ST,
                       options=VLLMOptions(enable_prefix_caching=apc), connector=conn)
    return env, e


def toks(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(1, 100_000, size=n).tolist()


def test_loaded_tokens_skip_compute_and_pay_their_load():
    conn = TierConnector(make_stack(MODEL, C))
    doc = toks(1, 512)
    conn.stack.save(doc)
    _, e = engine(conn)
    r = Request(0, doc + toks(2, 40), 2)
    e.submit([r])
    e.advance()
    ld = conn.loads[0]
    assert ld.new_tokens == 512 and ld.chunks == {"dram": 8}
    q = r.prompt_len - 512
    step = ST.cost(1, q, 512, attn_pairs(q, 512)).total_s
    assert math.isclose(r.first_token - r.first_scheduled, ld.load_s + step)
    assert e.scheduler.stats.prefix_hit_tokens == 0  # external hits are not local hits


def test_local_hit_is_not_loaded_again():
    conn = TierConnector(make_stack(MODEL, C))
    doc = toks(3, 512)
    _, e = engine(conn, apc=True)
    a, b = Request(0, doc + toks(4, 40), 2, 0.0), Request(1, doc + toks(5, 40), 2, 1.0)
    e.submit([a, b])
    e.advance()
    assert b.prefix_hit_tokens == 512  # HBM
    assert conn.loads[1].new_tokens == 0 and conn.loads[1].chunks == {}
    assert conn.saves[0].chunks == {"dram": 8, "remote": 8}


def test_save_is_charged_after_the_prefill():
    conn = TierConnector(make_stack(MODEL, C))
    _, e = engine(conn)
    r = Request(0, toks(6, 300), 3)
    e.submit([r])
    e.advance()
    sv = conn.saves[0]
    assert sv.chunks == {"dram": 4, "remote": 4}  # full chunks only (300 // 64)
    step = ST.cost(1, 1, 300, 301.0).total_s  # a decode: 300 tokens of context, 301 pairs
    # the second token's step waited for the device-to-host copy of the saved chunks
    assert math.isclose(r.token_times[1] - r.token_times[0], step + sv.d2h_s)


def test_without_a_connector_nothing_changes():
    reqs = lambda: [Request(i, toks(10 + i, 200), 4, 0.1 * i) for i in range(4)]  # noqa: E731
    _, plain = engine(None)
    a = reqs()
    plain.submit(a)
    plain.advance()
    conn = TierConnector(make_stack(MODEL, C, dram=False, remote=False))  # no tiers: no cost
    _, hooked = engine(conn)
    b = reqs()
    hooked.submit(b)
    hooked.advance()
    assert [r.token_times for r in a] == [r.token_times for r in b]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 300)), min_size=1, max_size=8),
       st.booleans())
def test_every_request_finishes_with_loaded_plus_computed_equal_to_its_prompt(spec, apc):
    conn = TierConnector(make_stack(MODEL, C))
    _, e = engine(conn, apc=apc)
    docs = [toks(20 + d, 256) for d in range(3)]
    reqs = [Request(i, docs[d] + toks(100 + i, q), 2, 0.05 * i) for i, (d, q) in enumerate(spec)]
    e.submit(reqs)
    e.advance()
    for r in reqs:
        assert r.state is ReqState.FINISHED
        ld = conn.loads[r.rid]
        assert r.prefix_hit_tokens + ld.new_tokens == ld.hit_tokens  # loaded: only beyond HBM
        assert ld.new_tokens == 0 or ld.hit_tokens % C.chunk_tokens == 0  # whole chunks
        assert r.prefix_hit_tokens + ld.new_tokens < r.prompt_len  # one token always computed
    e.pool.check_invariants()
