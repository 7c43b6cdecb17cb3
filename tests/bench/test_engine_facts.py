"""What a real colocation record says of its engine besides step times (bench/engine_facts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.bench import engine_facts

RECORDS = Path(engine_facts.__file__).resolve().parents[1] / "labs" / "colocation" / "records"
FIT = RECORDS / "h200-vllm026-20261201.repeats.json.gz"


def _rep(timeline, steps=None, requests=()):
    return {"repeat": 0, "runs": {"2/elastic": {"mapped_timeline": timeline, "steps": steps,
                                                "requests": list(requests)}}}


def test_page_id_step_and_layout():
    split = [[0.0, 128, 256, 0], [0.25, 384, 128, 128]]
    first = [[0.0, 64, 128, 0], [0.25, 192, 64, 320]]
    assert engine_facts.mapped_step_mib([_rep(split)]) == 128
    assert engine_facts.mapped_step_mib([_rep(first)]) == 64
    assert engine_facts.facts([_rep(split)], "llama-3.1-8b")["engine"]["kv_blocks_first"] is False
    assert engine_facts.facts([_rep(first)], "llama-3.1-8b")["engine"]["kv_blocks_first"] is True
    assert engine_facts.mapped_step_mib([_rep([])]) is None


def test_client_share_is_ttft_less_the_prefill_step():
    steps = [{"t0": 0.0, "fields": ["t", "dur_s", "prefill_tokens", "decode_tokens", "seqs"],
              "rows": [[0.0, 0.070, 256, 0, 1], [0.06, 0.01, 0, 1, 1]]}]
    reqs = [[0, 0.0, 0.077, 0.5, 43], [0, 0.3, 0.2, 0.6, 43]]  # the first request counts
    got = engine_facts.client_s([_rep([], steps, reqs)])
    assert got is not None and got[1] == 1 and got[0] == pytest.approx(0.007)


@pytest.mark.skipif(not FIT.exists(), reason="the fit sweep is not in this checkout")
def test_the_fit_sweep_facts():
    from workbench.labs.colocation.params import read_sweep

    f = engine_facts.facts(read_sweep(FIT), "llama-3.1-8b")
    assert f["engine"]["kv_blocks_first"] and f["engine"]["async_scheduling"]
    assert f["read_from"]["mapped_step_mib"] == 64
    assert 0.004 < f["read_from"]["client_s_measured"] < 0.010


@pytest.mark.skipif(not FIT.exists(), reason="the fit sweep is not in this checkout")
def test_the_gpus_turn_read_from_decodes_beside_decodes():
    from workbench.bench import steprows
    from workbench.labs.colocation.params import read_sweep

    reps = read_sweep(FIT)
    points = [p for r in reps for k in r["runs"] if (p := steprows.record_steps(r, k))]
    got = steprows.gpu_switch(points)
    assert got is not None and 0.3e-3 < got["switch_s"] < 1.0e-3
    # beside k decoding engines a small decode takes about k + 1 of its own steps, and more
    assert 2 * got["base_s"] < got["beside1_s"] < 3 * got["base_s"] < got["beside2_s"]
    assert steprows.gpu_switch(points[:0]) is None
