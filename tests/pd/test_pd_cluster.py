"""PD driver: the handover's timing follows the link model exactly, a PD decode instance never
runs a prefill chunk, and every request's TTFT is the sum of its phases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.engines.models import get_model
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sim.workloads import _tokens
from workbench.errors import ConfigError
from workbench.pd.cluster import PDConfig, run_colocated, run_pd
from workbench.pd.link import LinkSpec, handover_tokens, kv_bytes
from workbench.pd.phases import PHASES, phases

MODEL = get_model("llama-3.1-8b")


def _reqs(n: int, prompt: int, out: int, gap: float, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(i, _tokens(rng, prompt), out, 0.1 + i * gap, "x") for i in range(n)]


@settings(max_examples=40, deadline=None)
@given(bw=st.floats(1e8, 1e12), lat=st.floats(0, 1e-3), n=st.integers(0, 1 << 34))
def test_transfer_time_is_latency_plus_bytes_over_bandwidth(bw, lat, n):
    link = LinkSpec(bw, lat)
    assert link.transfer_s(n) == pytest.approx(lat + n / bw)
    assert link.transfer_s(2 * n) - link.transfer_s(n) == pytest.approx(n / bw)


def test_handover_carries_the_prompt_but_its_last_token():
    assert handover_tokens(4096) == 4095
    assert kv_bytes(MODEL, 4095) == 4095 * 131072  # 32 layers x 8 KV heads x 128 x K,V x bf16
    with pytest.raises(ConfigError, match="nothing to hand over"):
        handover_tokens(1)
    with pytest.raises(ConfigError, match="positive bandwidth"):
        LinkSpec(0.0)


def test_each_transfer_lasts_what_the_link_model_says():
    for gbps in (10.0, 20.0):
        cfg = PDConfig(link=LinkSpec(gbps * 1e9, 1e-4))
        res = run_pd(cfg, _reqs(3, 1024, 4, 2.0))
        for h in res.handovers.values():
            assert h.nbytes == 1023 * 131072
            assert h.landed - h.sent == pytest.approx(1e-4 + h.nbytes / (gbps * 1e9))
            assert h.sent == h.prefilled  # far apart: nobody waits for the link


def test_ttft_is_the_sum_of_its_phases_and_pd_pays_the_transfer():
    reqs = _reqs(4, 4096, 8, 2.0)
    pd = run_pd(PDConfig(), reqs)
    for r in pd.requests:
        h = pd.handovers[r.rid]
        ph = phases(r, pd.prefill_copies[r.rid], h.sent, h.landed)
        assert set(ph) == set(PHASES) and min(ph.values()) >= 0
        assert sum(ph.values()) == pytest.approx(r.first_token - r.arrival)
        assert pd.prefill_copies[r.rid].output_len == 1
    colo = run_colocated(PDConfig(), _reqs(4, 4096, 8, 2.0))
    xfer = PDConfig().link.transfer_s(4095 * 131072)
    for a, b in zip(pd.requests, colo.requests, strict=True):
        assert (a.first_token - a.arrival) - (b.first_token - b.arrival) > xfer


def test_the_link_queues_when_prompts_finish_together():
    reqs = [Request(i, list(range(1, 2049)), 2, 0.0, "x") for i in range(4)]
    res = run_pd(PDConfig(prefill=2, decode=1, link=LinkSpec(1e9, 0.0)), reqs)
    waits = sorted(h.sent - h.prefilled for h in res.handovers.values())
    assert waits[0] == 0.0 and waits[-1] > 2047 * 131072 / 1e9 * 0.99  # one channel: a queue
    assert all(r.state is ReqState.FINISHED for r in res.requests)


def test_pd_decode_steps_carry_no_prefill_chunks_colocated_ones_do():
    from workbench.labs.kit.serving import mix

    pd = run_pd(PDConfig(), mix(4.0, 80, 0.5, 0))
    colo = run_colocated(PDConfig(), mix(4.0, 80, 0.5, 0))
    dec = [u for u in pd.instances if u.role == "decode"]
    assert dec and all(u.chunk_tokens == 0 and u.mixed_steps == 0 for u in dec)
    assert sum(u.chunk_tokens for u in pd.instances if u.role == "prefill") > 0
    assert sum(u.mixed_steps for u in colo.instances) > 0
    with pytest.raises(ConfigError, match="both sides"):
        run_pd(PDConfig(prefill=0), [])
