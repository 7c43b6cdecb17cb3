"""The speed bench's arithmetic (``vllm_speed_report``) on made-up rows (no vLLM, no GPU):
per-repeat ratios with the warm-up left out, the floor from the best bandwidth reading, and the
verdicts; and its ``--pool`` option."""

from __future__ import annotations

import argparse
import math
import types

import pytest

from tests.adapters.test_vllm_reset_reap import Fence
from workbench.bench import vllm_speed
from workbench.bench import vllm_speed_report as report
from workbench.errors import ConfigError

ARGS = argparse.Namespace(prompt_lens=[128, 512], batches=[1, 16], context=128, decode=128,
                          model="llama-3.1-8b", lowload=0)
FACTS = {m: {"weight_bytes": 16_000_000_000, "build": "compiled ops", "runner": "R",
             "attention": ["FLASH_ATTN"], "compile_mode": "VLLM_COMPILE", "compile_s": 30.0,
             "cudagraph_mode": "FULL_AND_PIECEWISE", "custom_ops": ["none"]}
         for m in report.MODES}
BW = [{"gb_per_s": 3000.0, "device": "GPU"}, {"gb_per_s": 3200.0, "device": "GPU"}]
RUN = {"repeats": 3, "warmup": 1, "samples": 7}  # how a record says its points were taken


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
    table = report.summarize(_rows(stock, elastic), FACTS, BW, ARGS)
    assert [(r["kind"], r["n"]) for r in table] == list(stock)
    for r in table:
        assert r["pairs"] == 3 and r["tokens_equal"] == 3
        assert abs(r["ratio"]["median"] - 1.01) < 1e-9 and r["ratio_goal_met"]
    b1 = table[2]
    assert b1["floor_s"] == round(16e9 / 3.2e12, 6)  # the better of the two readings
    assert b1["floor_with_kv_s"] > b1["floor_s"]
    v = report.verdicts(table)
    assert v["prefill_grows_with_tokens"] and v["elastic_over_stock_le_1_02"]
    assert v["tpot_b1_over_floor"] == round(0.00707 / 0.005, 3)  # median repeat: 1.01 * 0.007
    assert v["tpot_b1_within_1_5x_floor"]
    md = report.markdown({"model": "llama-3.1-8b", "bandwidth": BW, "facts": FACTS,
                              "table": table, "verdicts": v, "command": "cmd", **RUN})
    assert "| TPOT batch 1 |" in md and "compiled ops" in md
    assert "median of 7 requests" in md and "A/A control" not in md
    aa = report.markdown({"model": "llama-3.1-8b", "bandwidth": BW, "facts": FACTS,
                          "table": table, "verdicts": v, "command": "cmd", "control": True, **RUN})
    assert "**A/A control (`--control`): the engine called elastic here is stock too" in aa


def test_a_slow_elastic_point_and_a_flat_prefill_miss_their_goals():
    stock = {("prefill", 128): 0.05, ("prefill", 512): 0.05, ("tpot", 1): 0.02,
             ("tpot", 16): 0.02}
    elastic = {**stock, ("tpot", 16): 0.0206}
    v = report.verdicts(report.summarize(_rows(stock, elastic), FACTS, BW, ARGS))
    assert not v["prefill_grows_with_tokens"] and not v["elastic_over_stock_le_1_02"]
    assert (v["worst_ratio"]["kind"], v["worst_ratio"]["at"]) == ("tpot", 16)
    assert not v["tpot_b1_within_1_5x_floor"]


def test_stock_alone_still_gives_its_figures_and_no_ratio_verdict():
    stock = {("prefill", 128): 0.02, ("prefill", 512): 0.05, ("tpot", 1): 0.007,
             ("tpot", 16): 0.008}
    rows = [r for r in _rows(stock, stock) if r["mode"] == "stock"]
    facts = {"stock": FACTS["stock"]}
    table = report.summarize(rows, facts, BW, ARGS)
    assert all(r["ratio"] is None and r["stock_s"]["n"] == 3 for r in table)
    v = report.verdicts(table)
    assert v["elastic_over_stock_le_1_02"] is None and v["worst_ratio"] is None
    assert v["prefill_grows_with_tokens"] and v["tpot_b1_within_1_5x_floor"]
    md = report.markdown({"model": "m", "bandwidth": BW, "facts": facts, "table": table,
                              **RUN,
                              "verdicts": v, "command": "c", "errors": {"elastic": "boom"}})
    assert "**elastic did not start**: boom" in md


def _lowload_rows(stock_ts: list[float], elastic_ts: list[float], rep: int = 0) -> list[dict]:
    """One row per request, as the bench asks a low-load point (the modes alternating)."""
    rows = []
    for k, (ts, te) in enumerate(zip(stock_ts, elastic_ts, strict=True)):
        for mode, t in (("stock", ts), ("elastic", te)):
            rows.append({"repeat": rep, "sample": k, "mode": mode, "kind": "lowload", "n":
                         len(stock_ts), "seconds": t, "tokens_sha": f"t{k}",
                         **({"pool": {"causes": {"map": 2, "reuse": 1} if k == 1 else {},
                                      "map_ms": 1.5, "unmap_ms": 0.5}}
                            if mode == "elastic" else {})})
    return rows


def test_the_low_load_point_judges_mean_and_p99_and_stays_out_of_the_1_02_goal():
    args = argparse.Namespace(**{**vars(ARGS), "prompt_lens": [128], "batches": [],
                                 "lowload": 4})
    stock = [0.010, 0.010, 0.010, 0.014]  # the last is the p99 of four
    elastic = [0.01044, 0.010, 0.010, 0.014]  # mean 1 % over stock's, the same tail
    rows = [r for rep in range(3) for r in _lowload_rows(stock, elastic, rep)]
    rows += [{"repeat": rep, "sample": 0, "mode": m, "kind": "prefill", "n": 128,
              "seconds": 0.01, "tokens_sha": "p"} for rep in range(3) for m in report.MODES]
    table = report.summarize(rows, FACTS, BW, args)
    low = table[-1]
    assert low["kind"] == "lowload" and abs(low["ratio"]["median"] - 1.01) < 1e-9
    assert low["stock_s"]["median"] == 0.011 and low["stock_p99_s"]["median"] == 0.014
    assert low["ratio_p99"]["median"] == 1.0 and not low["lowload_goal_met"]  # the mean missed
    assert low["tokens_equal"] == 3
    v = report.verdicts(table)
    assert v["elastic_over_stock_le_1_02"] and v["lowload_ttft_mean_and_p99_le_1_00"] is False
    md = report.markdown({"model": "m", "bandwidth": BW, "facts": FACTS, "table": table,
                          **RUN, "verdicts": v, "command": "cmd", "rows": rows})
    assert "| low-load TTFT p99 |" in md
    assert ("- lowload 4: {'map': 0.0, 'reuse': 0.0}; map 1.50 ms in the scheduler's calls, "
            "0.00 in steps, 0.00 idle; unmap 0.50 ms in the scheduler's calls, 0.00 in steps, "
            "0.00 idle") in md
    assert "engine core's own clock" not in md.split("| point |")[1].split("\n\n")[0]


def test_the_map_clock_counts_a_ledgers_transitions_and_its_map_time():
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.backends import make_device
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry, Layout
    from workbench.units import MiB

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=128 * 1024, block_size=1, num_blocks=64,
                     num_buffers=1, dtype_bytes=1, page_size=2 * MiB, layout=Layout.CONTIGUOUS)
    kv = BlockLedger(geo, make_device("sim", name="clock", capacity=16 * MiB), name="clock",
                     config=PoolConfig(min_reserved_pages=0, max_reserved_pages=0))
    try:
        clock = vllm_speed.MapClock(kv)
        before = clock.snapshot()
        kv.hold(range(16, 48))  # pages 1 and 2
        kv.release(range(16, 48))
        got = clock.since(before)
        assert got["causes"] == {"map": 2, "unmap": 2}
        assert got["map_ms"] > 0 and got["unmap_ms"] > 0 and got["mapped_bytes"] == 2 * MiB
        assert got["map_step_ms"] == got["unmap_idle_ms"] == 0.0
    finally:
        kv.close()


def test_the_map_clock_keeps_a_steps_refill_and_the_idle_loops_work_apart():
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.backends import make_device
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry, Layout
    from workbench.units import MiB

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=128 * 1024, block_size=1, num_blocks=64,
                     num_buffers=1, dtype_bytes=1, page_size=2 * MiB, layout=Layout.CONTIGUOUS)
    kv = BlockLedger(geo, make_device("sim", name="clock2", capacity=16 * MiB), name="clock2",
                     defer_release=True,
                     config=PoolConfig(min_reserved_pages=1, max_reserved_pages=1))
    kv.fence = Fence
    try:
        clock = vllm_speed.MapClock(kv)
        kv.refill_in_step()  # from here on the reserve refills in steps
        before = clock.snapshot()
        kv.hold(range(16, 48))  # pages 1 and 2: one from the reserve, one mapped inline
        kv.refill_in_step()  # the reserve's page, mapped while the forward runs
        kv.release(range(16, 48))  # both retire behind a fence
        kv.tidy()  # idle: both unmapped, the reserve already holds its one page
        got = clock.since(before)
        assert got["causes"] == {"reuse": 1, "map": 1, "prealloc": 1, "retire": 2, "unmap": 2}
        assert got["map_ms"] > 0 and got["map_step_ms"] > 0 and got["unmap_idle_ms"] > 0
        assert got["unmap_ms"] == got["map_idle_ms"] == got["unmap_step_ms"] == 0.0
        assert clock.where == ""
    finally:
        kv.close()


def test_a_prefill_ratio_cancels_the_cost_of_going_second():
    # elastic costs 1 %, and whichever mode goes second in a pair 4 % more; one pair of each
    # order also had a slow host (x1.3): the medians of each order read past it, and their
    # geometric mean past the order
    slow = {0: 1.3, 3: 1.3}
    rows = []
    for k in range(6):  # repeat 0: stock goes first at even k
        stock_second, host = k % 2 == 1, slow.get(k, 1.0)
        stock = 0.010 * (1.04 if stock_second else 1.0)
        elastic = 0.0101 * (1.0 if stock_second else 1.04) * host
        rows += [{"repeat": 0, "sample": k, "mode": m, "kind": "prefill", "n": 128,
                  "seconds": t, "tokens_sha": f"t{k}"}
                 for m, t in (("stock", stock), ("elastic", elastic))]
    args = argparse.Namespace(**{**vars(ARGS), "prompt_lens": [128], "batches": []})
    (row,) = report.summarize(rows, FACTS, BW, args)
    assert abs(row["ratio"]["median"] - 1.01) < 1e-9 and row["ratio_goal_met"]
    assert row["tokens_equal"] == 1 and row["stock_s"]["n"] == 1


def test_the_slowest_low_load_request_is_named_with_the_pool_work_on_its_path():
    rows = _lowload_rows([0.0101, 0.0102, 0.0100], [0.010, 0.0125, 0.011])
    assert report.slowest_lowload(rows) == \
        "elastic r0: #1 12.50 {'map': 2, 'reuse': 1}; stock r0: #1 10.20"


@pytest.mark.parametrize("bad", ["MAX_RESERVED_PAGES", "=3", "A B=1", "ÉTÉ=1", "a/b=2"])
def test_a_pool_setting_that_is_not_name_equals_value_is_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        vllm_speed.pool_env([bad])
    assert vllm_speed.pool_env(["max_reserved_pages=16"]) == \
        {"WORKBENCH_KV_MAX_RESERVED_PAGES": "16"}


# runpy warns that the module is imported already: a second copy beside it is the point here,
# as ``python -m`` makes one (``__main__``) beside the importable module
@pytest.mark.filterwarnings("ignore:'workbench.bench.vllm_speed' found in sys.modules")
def test_what_runs_in_the_engine_core_is_named_by_its_import_name_even_from_main():
    """The worker runs this file as ``-m`` (``__main__``): a function of that copy would reach
    vLLM's cloudpickle by value, its globals with it, so the engine core would build a new map
    clock on every call (it did on the H100: every map and unmap timed 0.00 ms)."""
    import runpy

    ns = runpy.run_module("workbench.bench.vllm_speed", run_name="__not_importable__")
    sent = []

    class LLM:
        def collective_rpc(self, fn, args=()):
            sent.append((fn, args))
            return [None]

    assert ns["PoolProbe"](LLM()).snapshot() is None
    (fn, args), = sent
    assert fn is vllm_speed._clock_ask and fn.__module__ == "workbench.bench.vllm_speed"
    assert args == ("snapshot",)


def test_an_aa_control_with_pool_settings_is_refused_before_anything_starts(capsys):
    from workbench.outfiles import run_main

    assert run_main(vllm_speed.main, ["--control", "--pool", "MAX_RESERVED_PAGES=16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --pool with --control") and err.count("\n") == 1


def test_the_engine_cores_own_clock_is_judged_beside_the_clients():
    """A prefill whose client-side time carries 4 ms of hops between processes in one mode's
    samples reads slower there; the engine core's clock, stamped in the core, reads past it."""
    rows = []
    for rep in range(3):
        for k in range(4):
            for m, hop in (("stock", 0.0), ("elastic", 0.004 if k == 1 else 0.0)):
                rows.append({"repeat": rep, "sample": k, "mode": m, "kind": "prefill",
                             "n": 128, "seconds": 0.014 + hop, "core_s": 0.010,
                             "tokens_sha": "p"})
    args = argparse.Namespace(**{**vars(ARGS), "prompt_lens": [128], "batches": []})
    (row,) = report.summarize(rows, FACTS, BW, args)
    assert row["ratio"]["median"] > 1.02 and not row["ratio_goal_met"]
    assert row["core_ratio"]["median"] == 1.0 and row["core_goal_met"]
    assert row["stock_core_s"]["median"] == 0.010
    assert report.verdicts([row])["engine_core"] == {"prefill 128": True}
    md = report.markdown({"model": "m", "bandwidth": BW, "facts": FACTS, "table": [row],
                          **RUN, "verdicts": report.verdicts([row]), "command": "c",
                          "rows": rows})
    assert "| prefill 128 tok, engine core's own clock | 10.00 ms [10.00, 10.00] |" in md
    nan = [{**r, "core_s": float("nan")} if r["sample"] == 2 else r for r in rows]
    (row,) = report.summarize(nan, FACTS, BW, args)  # a sample without vLLM's stats
    assert "core_ratio" not in row


def test_a_requests_core_time_runs_from_its_queueing_to_its_first_token():
    stats = types.SimpleNamespace(queued_ts=100.0, scheduled_ts=100.002, first_token_ts=100.0125)
    assert vllm_speed.core_first_token_s(types.SimpleNamespace(metrics=stats)) == \
        pytest.approx(0.0125)
    assert math.isnan(vllm_speed.core_first_token_s(types.SimpleNamespace(metrics=None)))
    unqueued = types.SimpleNamespace(queued_ts=0.0, first_token_ts=1.0)
    assert math.isnan(vllm_speed.core_first_token_s(types.SimpleNamespace(metrics=unqueued)))


def test_the_engines_start_in_the_order_asked_and_the_record_says_which_went_first():
    args = vllm_speed._parser().parse_args([])
    assert args.first == "stock" and vllm_speed.start_order(args) == ("stock", "elastic")
    args = vllm_speed._parser().parse_args(["--first", "elastic", "--control"])
    assert vllm_speed.start_order(args) == ("elastic", "stock")
    with pytest.raises(SystemExit):
        vllm_speed._parser().parse_args(["--first", "both"])
    stock = {("prefill", 128): 0.02, ("tpot", 1): 0.007}
    a = argparse.Namespace(**{**vars(ARGS), "prompt_lens": [128], "batches": [1]})
    table = report.summarize(_rows(stock, stock), FACTS, BW, a)
    md = report.markdown({"model": "m", "bandwidth": BW, "facts": FACTS, "table": table,
                          **RUN, "verdicts": report.verdicts(table), "command": "c",
                          "first": "elastic"})
    assert "started first: elastic." in md
