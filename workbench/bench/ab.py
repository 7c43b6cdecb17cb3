"""Interleaved A/B measurements of VMM-backed vs static KV on one model (issue 8's two ratios).

Single runs of the eager mini engine moved +-20% between runs, more than any VMM/static
difference, so both figures here come from alternated rounds on one model built once:

* **decode** (goal VMM/static >= 0.98): one discarded warm-up run per backend, then ``rounds``
  rounds, each one VMM and one static run (order alternating), of ``batch`` sequences with
  ``prompt_len``-token prompts generating ``gen`` tokens. A run's figure is tokens/s over the
  decode-only steps in which the whole batch decodes (``full_tok_s``) and over all decode-only
  steps (``decode_tok_s``); reported: every run, the medians per backend and the median of the
  per-round ratios.
* **low-load TTFT** (goal elastic/static <= 1.03): one instance, requests at a fixed ``rate`` (one
  every ``1/rate`` s), elastic (VMM pool mapping 128 MiB page ids on demand, a reserve of
  ``min_reserved``..``max_reserved`` page ids) vs a static allocation of the same budget, one
  discarded warm-up run per mode, then ``rounds`` alternated rounds; reported: mean and p50 TTFT
  per run, their medians per mode, and the medians of the per-round ratios.

* **steady decode** (``--parts steady``, :mod:`workbench.bench.steady`): at each of
  ``--steady-batches``, step time with and without decode CUDA graphs, its bandwidth floor and
  step / floor, and VMM / static decode over interleaved rounds (median, p10, p90, n); with
  ``--steady-profile``, where the step's time goes (:mod:`workbench.bench.stepprof`).

Python's garbage collector is collected before and paused during every measured run.
``python -m workbench.bench.ab --out DIR`` writes ``ab.json``; ``max_wall_s`` stops starting new
rounds once passed (what was measured is kept).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from workbench.bench import steady as steady_mod
from workbench.bench.mini import _engine
from workbench.bench.stats import PausedGC
from workbench.engines.sched.request import Request
from workbench.mini.colocation import Cluster, ColoConfig
from workbench.mini.model import build_model, get_config
from workbench.outfiles import Outputs, run_main, write_text
from workbench.strictjson import dumps
from workbench.units import GiB


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def decode_once(model, cfg, backend: str, batch: int, prompt_len: int, gen: int, kv_bytes: int,
                max_batched_tokens: int, device: str) -> dict:
    """One fresh engine of ``backend``; ``batch`` requests admitted together."""
    eng = _engine(model, cfg, backend, "block", kv_bytes, max_num_seqs=batch,
                  max_batched_tokens=max_batched_tokens)
    try:
        eng.generate([[7] * 8], 4)  # Triton compile, allocator
        eng.stats.steps.clear()
        prompts = [[(i * 131 + j * 7) % cfg.vocab_size for j in range(prompt_len)]
                   for i in range(batch)]
        _sync(device)
        with PausedGC():
            t0 = time.perf_counter()
            eng.generate(prompts, gen)
            wall = time.perf_counter() - t0
        dec = [s for s in eng.stats.steps if s.num_prefill_tokens == 0 and s.num_decode]
        full = [s for s in dec if s.num_decode == batch] or dec
        return {"backend": backend, "wall_s": wall, "n_decode_steps": len(dec),
                "n_full_steps": len(full),
                "decode_tok_s": sum(s.num_decode for s in dec) / sum(s.seconds for s in dec),
                "full_tok_s": sum(s.num_decode for s in full) / sum(s.seconds for s in full),
                "full_step_ms_median": 1e3 * statistics.median(s.seconds for s in full),
                "mapped_bytes": eng.kv.manager.mapped_bytes,
                "step_ms": [round(1e3 * s.seconds, 3) for s in dec]}
    finally:
        eng.close()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def decode_ab(model, cfg, *, rounds: int = 7, batch: int = 128, prompt_len: int = 1024,
              gen: int = 64, kv_gib: float = 24.0, max_batched_tokens: int = 8192,
              device: str = "cuda", deadline: float = float("inf"), log=print) -> dict:
    kv = int(kv_gib * GiB)
    args = (batch, prompt_len, gen, kv, max_batched_tokens, device)
    warm = {b: decode_once(model, cfg, b, *args)["full_tok_s"] for b in ("vmm", "static")}
    log(f"decode warm-up (discarded): vmm {warm['vmm']:.0f}, static {warm['static']:.0f} tok/s")
    runs: list[dict] = []
    ratios: list[float] = []
    step_ratios: list[float] = []
    for rnd in range(rounds):
        if time.perf_counter() > deadline:
            log(f"decode: wall budget reached after {rnd} rounds")
            break
        order = ("vmm", "static") if rnd % 2 == 0 else ("static", "vmm")
        got = {}
        for b in order:
            r = decode_once(model, cfg, b, *args)
            r["round"] = rnd
            runs.append(r)
            got[b] = r
        ratios.append(got["vmm"]["full_tok_s"] / got["static"]["full_tok_s"])
        step_ratios.append(got["static"]["full_step_ms_median"]
                           / got["vmm"]["full_step_ms_median"])
        log(f"decode round {rnd} ({order[0]} first): vmm {got['vmm']['full_tok_s']:.0f} "
            f"static {got['static']['full_tok_s']:.0f} tok/s, ratio {ratios[-1]:.4f} "
            f"(median step {got['vmm']['full_step_ms_median']:.2f} / "
            f"{got['static']['full_step_ms_median']:.2f} ms)")
    med = {b: _med([r["full_tok_s"] for r in runs if r["backend"] == b]) for b in ("vmm", "static")}
    return {"batch": batch, "prompt_len": prompt_len, "gen": gen, "kv_gib": kv_gib,
            "max_batched_tokens": max_batched_tokens, "warmup_tok_s": warm, "runs": runs,
            "median_tok_s": med, "round_ratios": ratios, "median_round_ratio": _med(ratios),
            "ratio_of_medians": med["vmm"] / med["static"] if med["vmm"] and med["static"]
            else None,
            "median_step_ratio": _med(step_ratios)}


def ttft_ab(model, model_name: str, *, rounds: int = 4, rate: float = 2.0, requests: int = 36,
            prompt_len: int = 256, output_len: int = 32, budget_gib: float = 2.0,
            min_reserved: int = 1, max_reserved: int = 2, device: str = "cuda",
            deadline: float = float("inf"), log=print) -> dict:
    """One instance, fixed-rate arrivals, elastic (VMM, reserve on) vs static KV."""
    cc = ColoConfig(model=model_name, instances=1, budget_gib=budget_gib, prompt_len=prompt_len,
                    min_reserved_pages=min_reserved, max_reserved_pages=max_reserved,
                    max_num_seqs=64, device=device, modes=("elastic", "static"))
    vocab = get_config(model_name).vocab_size
    trace = [[Request(i, [(i * 97 + j * 13 + 1) % vocab for j in range(prompt_len)], output_len,
                      i / rate) for i in range(requests)]]
    clusters = {m: Cluster(cc, m, [model]) for m in ("elastic", "static")}
    runs: list[dict] = []
    ratios: dict[str, list[float]] = {"mean": [], "p50": [], "tpot": []}

    def one(mode: str, tr) -> dict:
        with PausedGC():
            r = clusters[mode].run(tr, output_len)
        o = r["overall"]
        return {"mode": mode, "finished": o["finished"], "requests": o["requests"],
                "ttft_mean_ms": 1e3 * o["ttft"]["mean"], "ttft_p50_ms": 1e3 * o["ttft"]["p50"],
                "ttft_p99_ms": 1e3 * o["ttft"]["p99"], "tpot_ms": 1e3 * o["tpot"]["mean"],
                "preemptions": o["preemptions"], "wall_s": r["wall_s"],
                "mapped_peak_bytes": r["budget_peak_bytes"]}

    try:
        short = [trace[0][: max(2, requests // 6)]]
        for m in ("elastic", "static"):
            w = one(m, short)
            log(f"ttft warm-up {m} (discarded): mean {w['ttft_mean_ms']:.1f} ms")
        for rnd in range(rounds):
            if time.perf_counter() > deadline:
                log(f"ttft: wall budget reached after {rnd} rounds")
                break
            order = ("elastic", "static") if rnd % 2 == 0 else ("static", "elastic")
            got = {}
            for m in order:
                r = one(m, trace)
                r["round"] = rnd
                runs.append(r)
                got[m] = r
            e, s = got["elastic"], got["static"]
            ratios["mean"].append(e["ttft_mean_ms"] / s["ttft_mean_ms"])
            ratios["p50"].append(e["ttft_p50_ms"] / s["ttft_p50_ms"])
            ratios["tpot"].append(e["tpot_ms"] / s["tpot_ms"])
            log(f"ttft round {rnd} ({order[0]} first): mean e/s {e['ttft_mean_ms']:.1f} / "
                f"{s['ttft_mean_ms']:.1f} ms, p50 {e['ttft_p50_ms']:.1f} / "
                f"{s['ttft_p50_ms']:.1f} ms, TPOT {e['tpot_ms']:.1f} / {s['tpot_ms']:.1f} ms")
    finally:
        for c in clusters.values():
            c.close()
    med = {m: {k: _med([r[k] for r in runs if r["mode"] == m])
               for k in ("ttft_mean_ms", "ttft_p50_ms", "tpot_ms")} for m in ("elastic", "static")}
    return {"rate": rate, "requests": requests, "prompt_len": prompt_len,
            "output_len": output_len, "budget_gib": budget_gib,
            "reserve_pages": [min_reserved, max_reserved], "runs": runs, "medians": med,
            "round_ratios": ratios,
            "median_round_ratio": {k: _med(v) for k, v in ratios.items()}}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("artifacts/mini"))
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parts", default="decode,ttft")
    ap.add_argument("--decode-rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--kv-gib", type=float, default=24.0)
    ap.add_argument("--max-batched-tokens", type=int, default=8192)
    ap.add_argument("--ttft-rounds", type=int, default=4)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=36)
    ap.add_argument("--ttft-prompt-len", type=int, default=256)
    ap.add_argument("--ttft-gen", type=int, default=32)
    ap.add_argument("--budget-gib", type=float, default=2.0)
    ap.add_argument("--steady-batches", default="64,128")
    ap.add_argument("--steady-rounds", type=int, default=15)
    ap.add_argument("--steady-steps", type=int, default=8, help="steps per subject and round")
    ap.add_argument("--steady-prompt-len", type=int, default=1024)
    ap.add_argument("--steady-profile", action="store_true",
                    help="also measure where the step's time goes (bench.stepprof)")
    ap.add_argument("--max-wall-s", type=float, default=330.0,
                    help="start no new round after this many seconds from the start")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    start = time.perf_counter()
    path = Outputs().folder(args.out, ["ab.json"], "--out") / "ab.json"  # before the run
    on_gpu = args.device.startswith("cuda")
    res: dict = {"device": torch.cuda.get_device_name() if on_gpu else "cpu",
                 "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()}}

    def save() -> None:
        write_text(path, dumps(res, indent=1))

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    cfg = get_config(args.model)
    model = build_model(cfg, args.device)
    _sync(args.device)
    res["model_build_s"] = time.perf_counter() - start
    log(f"model {args.model} built")
    parts = args.parts.split(",")
    # the TTFT part needs about a third of the budget: keep it from being starved by decode
    decode_deadline = start + (0.55 if "ttft" in parts else 1.0) * args.max_wall_s
    if "steady" in parts:
        steady_part(res, model, cfg, args, log, start)
        save()
    if "decode" in parts:
        try:
            res["decode"] = decode_ab(model, cfg, rounds=args.decode_rounds, batch=args.batch,
                                      prompt_len=args.prompt_len, gen=args.gen,
                                      kv_gib=args.kv_gib,
                                      max_batched_tokens=args.max_batched_tokens,
                                      device=args.device, deadline=decode_deadline, log=log)
        except Exception:  # noqa: BLE001 - keep the other part
            import traceback

            res["decode_error"] = traceback.format_exc()
            log(res["decode_error"])
        save()
    if "ttft" in parts:
        try:
            res["ttft"] = ttft_ab(model, args.model, rounds=args.ttft_rounds, rate=args.rate,
                                  requests=args.requests, prompt_len=args.ttft_prompt_len,
                                  output_len=args.ttft_gen, budget_gib=args.budget_gib,
                                  device=args.device, deadline=start + args.max_wall_s, log=log)
        except Exception:  # noqa: BLE001
            import traceback

            res["ttft_error"] = traceback.format_exc()
            log(res["ttft_error"])
        save()
    res["wall_s"] = time.perf_counter() - start
    save()
    print(summary(res))
    return 0


def steady_part(res: dict, model, cfg, args, log, start: float) -> None:
    """Every batch of ``--steady-batches`` in turn, each within its share of the wall budget."""
    batches = [int(b) for b in args.steady_batches.split(",") if b]
    res["steady"] = []
    for i, b in enumerate(batches):
        now = time.perf_counter()
        try:
            res["steady"].append(steady_mod.steady(
                model, cfg, batch=b, prompt_len=args.steady_prompt_len,
                rounds=args.steady_rounds, steps=args.steady_steps, kv_gib=args.kv_gib,
                profile=args.steady_profile,
                deadline=now + (start + args.max_wall_s - now) / (len(batches) - i), log=log))
        except Exception:  # noqa: BLE001 - keep the other batches and parts
            import traceback

            res.setdefault("steady_error", []).append(traceback.format_exc())
            log(res["steady_error"][-1])
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _f(x, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def summary(res: dict) -> str:
    lines = [f"== mini A/B on {res.get('device')} (torch {res.get('torch')}) =="]
    for st in res.get("steady", []):
        lines += steady_mod.summary(st)
    d = res.get("decode")
    if d:
        for b in ("vmm", "static"):
            lines.append(f"decode {b:6s} tok/s: " + ", ".join(
                f"{r['full_tok_s']:.0f}" for r in d["runs"] if r["backend"] == b)
                + f"  | median {_f(d['median_tok_s'][b], '.0f')}")
        lines.append(f"decode VMM/static: median of round ratios {_f(d['median_round_ratio'])}, "
                     f"ratio of medians {_f(d['ratio_of_medians'])}, median step ratio "
                     f"{_f(d['median_step_ratio'])} (goal >= 0.98); rounds "
                     + ", ".join(f"{x:.3f}" for x in d["round_ratios"]))
    t = res.get("ttft")
    if t:
        for m in ("elastic", "static"):
            lines.append(f"ttft {m:7s} mean/p50 ms: " + ", ".join(
                f"{r['ttft_mean_ms']:.1f}/{r['ttft_p50_ms']:.1f}" for r in t["runs"]
                if r["mode"] == m) + f"  | medians {_f(t['medians'][m]['ttft_mean_ms'], '.1f')}/"
                f"{_f(t['medians'][m]['ttft_p50_ms'], '.1f')}")
        mr = t["median_round_ratio"]
        lines.append(f"ttft elastic/static median round ratio: mean {_f(mr['mean'])}, p50 "
                     f"{_f(mr['p50'])}, TPOT {_f(mr['tpot'])} (goal <= 1.03); mean rounds "
                     + ", ".join(f"{x:.3f}" for x in t["round_ratios"]["mean"]))
    for k in ("decode_error", "ttft_error", "steady_error"):
        if k in res:
            lines.append(f"{k}: {str(res[k])[-600:]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_main(main))
