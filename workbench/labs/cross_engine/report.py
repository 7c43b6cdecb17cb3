"""The cross-engine lab's checks, Markdown, record and figures (:mod:`.sim`)."""

from __future__ import annotations

from typing import Any

from workbench.engines.models import get_model
from workbench.labs.kit.base import LabResult
from workbench.labs.kit.phase_figs import latency_lines, phase_rows, timeline_figure
from workbench.labs.kit.phased_sim import window_slice
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.units import GiB

FIGURE_RUNS = ("alternate-vllm-first", "together", "vllm-cache-only", "bounds-vllm-big")


PAIR = ("vllm", "sglang")  # the simulated pair's instances, named by their schedulers

def _inst(run: dict, kind: str) -> dict:
    return next(i for i in run["instances"] if i["kind"] == kind)


def _win(run: dict, kind: str, phase: str) -> dict[str, list]:
    name = _inst(run, kind)["name"]
    w = next(w for w in run["windows"][name] if w["name"] == phase)
    return window_slice(run["timeline"][name], w["start"], w["end"])


def peak(run: dict, kind: str, phase: str) -> int:
    return max(_win(run, kind, phase)["mapped_bytes"])


def p99(run: dict, kind: str, phase: str) -> float:
    return _inst(run, kind)["by_phase"][phase]["ttft"]["p99"]


def _total(run: dict) -> list[int]:
    a, b = (run["timeline"][i["name"]]["mapped_bytes"] for i in run["instances"])
    return [x + y for x, y in zip(a, b, strict=True)]


def stage_checks(r: dict[str, dict], budget: int) -> dict[str, bool]:
    """The six stages' claims on one seed's runs (``r``: config name -> run)."""
    alt_v, alt_s, tog = r["alternate-vllm-first"], r["alternate-sglang-first"], r["together"]
    vc, sc = r["vllm-cache-only"], r["sglang-cache-only"]
    floor = {k: _win(r[f"alone-{k}"], k, "P2")["mapped_bytes"][-1] for k in PAIR}
    ppb = alt_v["page_id_bytes"]
    return {
        "1_alone_no_preemption": all(_inst(r[f"alone-{k}"], k)["summary"]["preemptions"] == 0
                                     for k in PAIR),
        "2_reuse_vllm_to_sglang": peak(alt_v, "vllm", "P1") + peak(alt_v, "sglang", "P2")
        > budget,
        "2_reuse_sglang_to_vllm": peak(alt_s, "sglang", "P1") + peak(alt_s, "vllm", "P2")
        > budget,
        "all_within_budget": all(max(_total(x)) <= budget for x in r.values()),
        "3_together_fill_budget": max(_total(tog)) >= budget - 2 * ppb,
        "3_both_slower_than_alone": all(p99(tog, k, "P1") > p99(r[f"alone-{k}"], k, "P1")
                                        for k in PAIR),
        "3_both_miss": all(_inst(tog, k)["stats"]["misses"] > 0 for k in PAIR),
        "4_vllm_cache_holds_idle": _win(vc, "vllm", "P2")["mapped_bytes"][-1] > floor["vllm"],
        "4_sglang_squeezed": peak(vc, "sglang", "P2") < peak(alt_v, "sglang", "P2")
        and p99(vc, "sglang", "P2") > p99(alt_v, "sglang", "P2"),
        "5_sglang_cache_holds_idle": _win(sc, "sglang", "P2")["mapped_bytes"][-1]
        > floor["sglang"],
        "5_vllm_squeezed": peak(sc, "vllm", "P2") < peak(alt_s, "vllm", "P2")
        and p99(sc, "vllm", "P2") > p99(alt_s, "vllm", "P2"),
        "6_big_bound_wins_vllm": p99(r["bounds-vllm-big"], "vllm", "peak")
        < p99(r["bounds-vllm-big"], "sglang", "peak"),
        "6_big_bound_wins_sglang": p99(r["bounds-sglang-big"], "sglang", "peak")
        < p99(r["bounds-sglang-big"], "vllm", "peak"),
        "no_live_unmaps": all(not x["live_unmaps"] for x in r.values()),
    }


EXPECT = [
    ("1", "caches off, each alone: the allocation baseline", ("1_alone_no_preemption",)),
    ("2", "alternating traffic: physical pages are reused across the engines",
     ("2_reuse_vllm_to_sglang", "2_reuse_sglang_to_vllm", "all_within_budget")),
    ("3", "both at once: each scheduler meets its own misses (vLLM preempts, SGLang retracts)",
     ("3_together_fill_budget", "3_both_slower_than_alone", "3_both_miss")),
    ("4", "only vLLM's prefix cache: its cached pages shrink SGLang's headroom",
     ("4_vllm_cache_holds_idle", "4_sglang_squeezed")),
    ("5", "only SGLang's radix cache: the reverse", ("5_sglang_cache_holds_idle",
                                                     "5_vllm_squeezed")),
    ("6", "both caches, different bounds: no fairness, the bigger bound wins the tail",
     ("6_big_bound_wins_vllm", "6_big_bound_wins_sglang")),
    ("all", "no page with a live block is unmapped", ("no_live_unmaps",)),
]


def numbers(r: dict[str, dict]) -> dict[str, str]:
    """One line of figures per stage (one seed)."""
    g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
    ms = lambda x: f"{x * 1e3:,.0f} ms"  # noqa: E731
    tog, vc, sc = r["together"], r["vllm-cache-only"], r["sglang-cache-only"]
    alt_v, alt_s = r["alternate-vllm-first"], r["alternate-sglang-first"]
    bv, bs, bo = r["bounds-vllm-big"], r["bounds-sglang-big"], r["bounds-off"]
    st = {k: _inst(tog, k)["stats"] for k in PAIR}
    return {
        "1": "; ".join(f"{k} peak {g(peak(r[f'alone-{k}'], k, 'P1'))}, TTFT p99 "
                       f"{ms(p99(r[f'alone-{k}'], k, 'P1'))}" for k in PAIR),
        "2": f"vLLM {g(peak(alt_v, 'vllm', 'P1'))} then SGLang {g(peak(alt_v, 'sglang', 'P2'))}"
             f"; SGLang {g(peak(alt_s, 'sglang', 'P1'))} then vLLM "
             f"{g(peak(alt_s, 'vllm', 'P2'))}",
        "3": "; ".join(f"{k}: TTFT p99 {ms(p99(tog, k, 'P1'))}, {st[k]['misses']} misses, "
                       f"{st[k]['preemptions']} {'preemptions' if k == 'vllm' else 'retractions'}"
                       f", {st[k]['recomputed_tokens']} tokens recomputed"
                       for k in PAIR),
        "4": f"vLLM idle holds {g(_win(vc, 'vllm', 'P2')['mapped_bytes'][-1])}; SGLang peak "
             f"{g(peak(vc, 'sglang', 'P2'))} (stage 2: {g(peak(alt_v, 'sglang', 'P2'))}), "
             f"TTFT p99 {ms(p99(vc, 'sglang', 'P2'))} (stage 2: "
             f"{ms(p99(alt_v, 'sglang', 'P2'))}); vLLM's repeat of its P1 traffic hit "
             f"{_inst(vc, 'vllm')['by_phase']['P3']['prefix_hit_tokens']} tokens",
        "5": f"SGLang idle holds {g(_win(sc, 'sglang', 'P2')['mapped_bytes'][-1])}; vLLM peak "
             f"{g(peak(sc, 'vllm', 'P2'))} (stage 2: {g(peak(alt_s, 'vllm', 'P2'))}), TTFT p99 "
             f"{ms(p99(sc, 'vllm', 'P2'))} (stage 2: {ms(p99(alt_s, 'vllm', 'P2'))})",
        "6": "; ".join(f"{name}: vLLM {ms(p99(x, 'vllm', 'peak'))} / SGLang "
                       f"{ms(p99(x, 'sglang', 'peak'))}" for name, x in
                       (("off", bo), ("vLLM big", bv), ("SGLang big", bs))),
        "all": f"{sum(x['unmaps'] for x in r.values())} unmaps, "
               f"{sum(len(x['live_unmaps']) for x in r.values())} with a live block"}


def markdown(p: Any, data: dict, found: list[dict[str, bool]]) -> str:
    first = {n: runs[data["seeds"][0]] for n, runs in data["runs"].items()}
    nums = numbers(first)
    lines = ["# vLLM-like and SGLang-like on one device (simulated)", "",
             f"{p.model} on a simulated {p.gpu} with {p.kv_budget_gib:g} GiB of KV headroom; "
             f"seed 000 §8. Peaks: {p.peak_rate:g} req/s of {p.prompt_len}/{p.output_len} "
             f"tokens for {p.phase_s:g} s, the same traffic in every peak. Seeds "
             f"{data['seeds']}, every configuration per seed, the order reversed on odd seeds.",
             "", "| stage | the seed expects | seeds that agree | measured (first seed) |",
             "|---|---|---|---|"]
    for st, text, keys in EXPECT:
        agree = sum(all(f[k] for k in keys) for f in found)
        lines.append(f"| {st} | {text} | {agree}/{len(found)} | {nums[st]} |")
    lines += latency_lines({n: [runs[s] for s in data["seeds"]]
                            for n, runs in data["runs"].items()},
                           "Latency per configuration and phase (requests of all seeds pooled)")
    lines += ["", "## Reading it", "",
              "* Neither engine knows the other: the only thing they share is the device's free "
              "memory. What one unmaps the other can map (stage 2); nothing moves memory the "
              "other way while it is still mapped.",
              "* A prefix cache with no bound keeps its pages after the traffic is gone; the "
              "cache's owner evicts only for its own allocations, so the other engine runs on "
              "its reserve (stages 4 and 5: a starved engine's peak mapped stays at its idle "
              "floor, its TTFT jumps by seconds).",
              "* The repeat of the vLLM traffic in stage 4 hits only when the cache still holds "
              "its first prompts: a repeat larger than the cache, replayed in the same order, "
              "evicts (LRU) exactly the blocks it needs next, so the hit count varies by seed "
              "(it is reported, not claimed).",
              "* With both caches on, the engine with the bigger bound keeps more pages from the "
              "warm-up and wins the tail latency; swapping the bounds swaps the winner (stage 6)."
              " KVCacheD has no global request priority: fairness comes only from physical "
              "competition, each engine's cache bound and external limits.",
              "", "## Differences from a real run", "",
              "* Both engines are the workbench's simulated schedulers (vLLM V1-like with "
              "chunked prefill; SGLang-like extend/decode with retraction); real ones differ in "
              "admission details, CUDA graphs and the API server.",
              "* The two instances time-slice one simulated GPU per step; a real GPU interleaves "
              "kernels of two processes.",
              "* Step times are a roofline model: the latencies are relative, the page counts "
              "exact."]
    return "\n".join(lines) + "\n"


def fairness_figure(first: dict[str, dict]) -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError:
        return None
    names = ["together", "vllm-cache-only", "sglang-cache-only", "bounds-off",
             "bounds-vllm-big", "bounds-sglang-big"]
    phase = {"together": "P1", "vllm-cache-only": "P2", "sglang-cache-only": "P2"}
    fig = go.Figure()
    for k in PAIR:
        ys = []
        for n in names:
            ph = phase.get(n, "peak")
            ys.append(p99(first[n], k, ph) * 1e3 if ph in _inst(first[n], k)["by_phase"] else None)
        fig.add_bar(x=names, y=ys, name=f"{k} TTFT p99")
    fig.update_layout(title="tail latency per engine under contention (nothing equalises it)",
                      yaxis_title="TTFT p99 (ms)", barmode="group")
    return fig


def build(p: Any, data: dict, backend: str) -> LabResult:
    budget = int(p.kv_budget_gib * GiB)
    found = [stage_checks({n: runs[s] for n, runs in data["runs"].items()}, budget)
             for s in data["seeds"]]
    first = {n: runs[data["seeds"][0]] for n, runs in data["runs"].items()}
    rows = [row for n, run in first.items() for row in phase_rows(run, n) if row["requests"]]
    figs: dict[str, Any] = {n: timeline_figure(first[n], f"{n}: mapped KV (stacked)",
                                               stacked=True) for n in FIGURE_RUNS}
    figs["fairness"] = fairness_figure(first)
    figs = {k: v for k, v in figs.items() if v is not None}
    checks = [dict(f, seed=s) for f, s in zip(found, data["seeds"], strict=True)]
    return LabResult(record(p, data, found, rows, backend), markdown(p, data, found),
                     tables={"phases": rows, "checks": checks}, figures=figs)


def record(p: Any, data: dict, found: list[dict], rows: list[dict], backend: str) -> LabRecord:
    spec = get_model(p.model)
    first = {n: runs[data["seeds"][0]] for n, runs in data["runs"].items()}

    def per(key: str) -> dict:
        return {f"{n}/{i['kind']}": i["summary"][key] for n, run in first.items()
                for i in run["instances"]}

    ok = all(all(f.values()) for f in found)
    return LabRecord(
        experiment_id=f"cross-engine-{p.model}-{p.gpu}",
        hypothesis="two engines with no shared metadata reuse each other's physical pages; "
                   "nothing makes their share of the headroom fair",
        environment={"backend": backend, "seeds": data["seeds"],
                     "kv_budget_gib": p.kv_budget_gib,
                     "command": "workbench labs run cross-engine --backend sim"},
        model_io={"model": spec.name, "prompt": p.prompt_len, "output": p.output_len},
        cache_state="per configuration: off, vLLM only, SGLang only, both bounded",
        load={"peak_rate": p.peak_rate, "warm_rate": p.warm_rate, "phase_s": p.phase_s,
              "configs": {c.name: c.stage for c in data["configs"]}},
        samples={"seeds": data["seeds"], "order": data["order"]},
        outcomes=per("finished"), ttft=per("ttft"),
        tpot_itl={"tpot": per("tpot"), "itl": per("itl")}, e2e=per("e2e"),
        throughput=per("output_tok_per_s"), slo_goodput={"goodput_req_per_s":
                                                         per("goodput_req_per_s")},
        hits={"hit_tokens": per("prefix_hit_tokens"), "prompt_tokens": per("prompt_tokens")},
        transfer_bytes=None, phase_times=None,
        kv={"checks": found, "preemptions": per("preemptions")}, correctness=None,
        raw_data={"timelines": "results.timelines (first seed, every 0.5 s)"},
        verdict="supported" if ok else "refuted: see kv.checks",
        mechanism="each engine allocates from its own pool; pools map from one device first "
                  "come first served; a cache's owner evicts only for itself",
        open_questions=["real engines' admission and eviction differ in detail",
                        "GPU compute sharing is step-granular time slicing"],
        applicability="one vLLM-like and one SGLang-like instance, TP 1, a few GiB of headroom",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}", "kv_budget_gib": p.kv_budget_gib},
            engine_config={"engines": ["vllm-like (sim)", "sglang-like (sim)"],
                           "model": spec.name},
            kvcached_config={"page_size": 2 << 20, "min_reserved_pages": 5,
                             "max_reserved_pages": 10,
                             "max_cached_tokens": {"big": p.big_bound, "small": p.small_bound}}),
        results={"phases": rows,  # timelines every 0.5 s: ten runs of two instances
                 "timelines": {n: {name: {k: v[::5] for k, v in tl.items()}
                                   for name, tl in r["timeline"].items()}
                               for n, r in first.items()},
                 "windows": {n: r["windows"] for n, r in first.items()}})
