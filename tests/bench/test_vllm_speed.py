"""The speed bench's arithmetic on made-up rows (no vLLM, no GPU): per-repeat ratios with the
warm-up left out, the floor from the best bandwidth reading, and the verdicts."""

from __future__ import annotations

import argparse

from workbench.bench import vllm_speed

ARGS = argparse.Namespace(prompt_lens=[128, 512], batches=[1, 16], context=128, decode=128,
                          model="llama-3.1-8b")
FACTS = {m: {"weight_bytes": 16_000_000_000, "build": "compiled ops", "runner": "R",
             "attention": ["FLASH_ATTN"], "compile_mode": "VLLM_COMPILE", "compile_s": 30.0,
             "cudagraph_mode": "FULL_AND_PIECEWISE", "custom_ops": ["none"]}
         for m in vllm_speed.MODES}
BW = [{"gb_per_s": 3000.0, "device": "GPU"}, {"gb_per_s": 3200.0, "device": "GPU"}]


def _rows(stock: dict, elastic: dict, warm: float = 9.0) -> list[dict]:
    rows = []
    for rep in range(-1, 3):
        for (kind, n), base in stock.items():
            for mode, s in (("stock", base), ("elastic", elastic[(kind, n)])):
                rows.append({"repeat": rep, "mode": mode, "kind": kind, "n": n,
                             "seconds": warm if rep < 0 else s * (1 + rep / 100),
                             "tokens_sha": "a"})
    return rows


def test_ratios_pair_repeats_and_leave_the_warmup_out():
    stock = {("prefill", 128): 0.02, ("prefill", 512): 0.05, ("tpot", 1): 0.007,
             ("tpot", 16): 0.008}
    elastic = {k: v * 1.01 for k, v in stock.items()}
    table = vllm_speed.summarize(_rows(stock, elastic), FACTS, BW, ARGS)
    assert [(r["kind"], r["n"]) for r in table] == list(stock)
    for r in table:
        assert r["pairs"] == 3 and r["tokens_equal"] == 3
        assert abs(r["ratio"]["median"] - 1.01) < 1e-9 and r["ratio_goal_met"]
    b1 = table[2]
    assert b1["floor_s"] == round(16e9 / 3.2e12, 6)  # the better of the two readings
    assert b1["floor_with_kv_s"] > b1["floor_s"]
    v = vllm_speed.verdicts(table)
    assert v["prefill_grows_with_tokens"] and v["elastic_over_stock_le_1_02"]
    assert v["tpot_b1_over_floor"] == round(0.00707 / 0.005, 3)  # median repeat: 1.01 * 0.007
    assert v["tpot_b1_within_1_5x_floor"]
    md = vllm_speed.markdown({"model": "llama-3.1-8b", "bandwidth": BW, "facts": FACTS,
                              "table": table, "verdicts": v, "command": "cmd"})
    assert "| TPOT batch 1 |" in md and "compiled ops" in md


def test_a_slow_elastic_point_and_a_flat_prefill_miss_their_goals():
    stock = {("prefill", 128): 0.05, ("prefill", 512): 0.05, ("tpot", 1): 0.02,
             ("tpot", 16): 0.02}
    elastic = {**stock, ("tpot", 16): 0.0206}
    v = vllm_speed.verdicts(vllm_speed.summarize(_rows(stock, elastic), FACTS, BW, ARGS))
    assert not v["prefill_grows_with_tokens"] and not v["elastic_over_stock_le_1_02"]
    assert (v["worst_ratio"]["kind"], v["worst_ratio"]["at"]) == ("tpot", 16)
    assert not v["tpot_b1_within_1_5x_floor"]


def test_stock_alone_still_gives_its_figures_and_no_ratio_verdict():
    stock = {("prefill", 128): 0.02, ("prefill", 512): 0.05, ("tpot", 1): 0.007,
             ("tpot", 16): 0.008}
    rows = [r for r in _rows(stock, stock) if r["mode"] == "stock"]
    facts = {"stock": FACTS["stock"]}
    table = vllm_speed.summarize(rows, facts, BW, ARGS)
    assert all(r["ratio"] is None and r["stock_s"]["n"] == 3 for r in table)
    v = vllm_speed.verdicts(table)
    assert v["elastic_over_stock_le_1_02"] is None and v["worst_ratio"] is None
    assert v["prefill_grows_with_tokens"] and v["tpot_b1_within_1_5x_floor"]
    md = vllm_speed.markdown({"model": "m", "bandwidth": BW, "facts": facts, "table": table,
                              "verdicts": v, "command": "c", "errors": {"elastic": "boom"}})
    assert "**elastic did not start**: boom" in md
