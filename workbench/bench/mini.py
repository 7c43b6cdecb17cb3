"""GPU measurements of the mini engine: paged kernel, decode throughput VMM vs static, step times.

``python -m workbench.bench.mini --out DIR`` writes ``bench.json`` (every figure and every engine
step, for the step-time fit) and prints a short table. Each part is independent and time-boxed so
one failure still leaves the others' numbers.

* kernel: Triton paged decode vs the torch gather path at Llama-3.1-8B's layer shape (32 q heads,
  8 KV heads, 128 dim), relative error against fp32 and median time (CUDA events, do_bench).
* decode: the 8B-shaped model, ``batch`` sequences decoding together, tokens/s over decode-only
  steps, VMM-backed (workbench.gpu) vs a plain static allocation, alternated ``reps`` times.
* steps: prefill steps of several chunk sizes and decode steps of several batch sizes and
  contexts, for fitting the simulator's step-time model (:mod:`workbench.bench.stepfit`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from workbench.mini.attention import paged_decode, reference_decode, softmax_scale
from workbench.mini.engine import Engine, EngineConfig
from workbench.mini.kv import KVSpec
from workbench.mini.model import build_model, get_config
from workbench.outfiles import Outputs, run_main, write_text
from workbench.strictjson import dumps
from workbench.units import GiB


def _time_ms(fn, reps: int = 50) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=reps, return_mode="median"))


def kernel_bench(batch: int = 64, ctxs: tuple[int, ...] = (512, 2048, 8192)) -> list[dict]:
    nh, nkv, hd, bs = 32, 8, 128, 16
    out = []
    for ctx in ctxs:
        gen = torch.Generator(device="cuda").manual_seed(ctx)
        n_entries = ctx // bs
        nb = batch * n_entries + 1
        kc = torch.randn(nb, bs, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        vc = torch.randn(nb, bs, nkv, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        table = (torch.randperm(nb - 1, device="cuda", generator=gen)[: batch * n_entries] + 1)
        table = table.view(batch, n_entries).to(torch.int32)
        lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        q = torch.randn(batch, nh, hd, device="cuda", generator=gen, dtype=torch.bfloat16)
        sc = softmax_scale(hd)
        ref = reference_decode(q, kc, vc, table, lens, bs, sc).double()
        row = {"batch": batch, "ctx": ctx}
        kv_bytes = 2 * batch * ctx * nkv * hd * 2
        args = (q, kc, vc, table, lens, bs, sc)
        for impl in ("triton", "torch"):
            got = paged_decode(*args, impl=impl).double()
            row[f"{impl}_rel_err"] = ((got - ref).norm() / ref.norm()).item()
            ms = _time_ms(lambda a=args, impl=impl: paged_decode(*a, impl=impl))
            row[f"{impl}_ms"] = ms
            row[f"{impl}_GBps"] = kv_bytes / ms / 1e6
        out.append(row)
        del kc, vc, args
        torch.cuda.empty_cache()
    return out


def _engine(model, cfg, backend: str, style: str, kv_bytes: int, **ecfg) -> Engine:
    bs = 16 if style == "block" else 1
    dev = next(model.parameters()).device
    return Engine(cfg, KVSpec(style=style, backend=backend, kv_bytes=kv_bytes, block_size=bs),
                  dev, EngineConfig(**ecfg), model=model, name=f"{backend}-{style}")


def decode_run(model, cfg, backend: str, style: str, batch: int, prompt_len: int, gen: int,
               kv_bytes: int) -> dict:
    """``batch`` requests admitted together; tok/s over the steps that only decode."""
    eng = _engine(model, cfg, backend, style, kv_bytes, max_num_seqs=batch,
                  max_batched_tokens=max(2048, prompt_len))
    try:
        eng.generate([[7] * 8], 4)  # warm-up: Triton compile, allocator
        eng.stats.steps.clear()
        prompts = [[(i * 131 + j * 7) % cfg.vocab_size for j in range(prompt_len)]
                   for i in range(batch)]
        t0 = time.perf_counter()
        eng.generate(prompts, gen)
        wall = time.perf_counter() - t0
        dec = [s for s in eng.stats.steps if s.num_prefill_tokens == 0 and s.num_decode]
        toks = sum(s.num_decode for s in dec)
        secs = sum(s.seconds for s in dec)
        return {"backend": backend, "style": style, "batch": batch, "prompt_len": prompt_len,
                "gen": gen, "decode_tok_s": toks / secs, "decode_step_ms_median":
                1e3 * statistics.median(s.seconds for s in dec), "wall_s": wall,
                "mapped_bytes": eng.kv.manager.mapped_bytes,
                "steps": [s.row() for s in eng.stats.steps]}
    finally:
        eng.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


SWEEP = ((1, 512), (8, 512), (32, 512), (64, 512), (128, 512), (32, 2048), (48, 2048), (16, 4096))


def step_sweep(model, cfg, kv_bytes: int, chunks=(128, 512, 1024, 2048, 4096), sweep=SWEEP
               ) -> list[list]:
    """:meth:`StepStats.row` of varied steps (prefill-only chunks, decode batches)."""
    rows: list[list] = []
    eng = _engine(model, cfg, "vmm", "block", kv_bytes, max_num_seqs=256,
                  max_batched_tokens=8192)
    try:
        eng.generate([[3] * 8], 2)
        for chunk in chunks:  # prefill-only steps
            eng.stats.steps.clear()
            eng.scheduler.budget = chunk
            eng.generate([[(j * 5) % cfg.vocab_size for j in range(chunk)]] * 2, 1)
            rows += [s.row() for s in eng.stats.steps]
        eng.scheduler.budget = 8192
        for batch, ctx in sweep:
            eng.stats.steps.clear()
            eng.generate([[(i + j) % cfg.vocab_size for j in range(ctx)] for i in range(batch)],
                         16)
            rows += [s.row() for s in eng.stats.steps]
    finally:
        eng.close()
    return rows


def decode_part(res: dict, model, cfg, batch: int, prompt_len: int, gen: int, reps: int,
                kv_bytes: int) -> None:
    """Decode tokens/s, VMM vs static in alternating order, then the token-slot style."""
    runs = []
    try:
        # discarded: the first full-size run was 2x slower in the first GPU session
        # (clocks, allocator growth, cuBLAS heuristics for the new shapes)
        decode_run(model, cfg, "static", "block", batch, prompt_len, 16, kv_bytes)
        for rep in range(reps):
            order = ("vmm", "static") if rep % 2 == 0 else ("static", "vmm")
            for backend in order:
                r = decode_run(model, cfg, backend, "block", batch, prompt_len, gen, kv_bytes)
                runs.append(r)
                print(f"decode {backend:6s} rep {rep}: {r['decode_tok_s']:8.0f} tok/s "
                      f"(median step {r['decode_step_ms_median']:.2f} ms)", flush=True)
        r = decode_run(model, cfg, "vmm", "token", batch, prompt_len, gen, kv_bytes)
        runs.append(r)
        print(f"decode vmm token-style: {r['decode_tok_s']:8.0f} tok/s", flush=True)
    except Exception:  # noqa: BLE001 - keep the other parts
        res["decode_error"] = traceback.format_exc()
    res["decode"] = runs
    vm = [r["decode_tok_s"] for r in runs if r["backend"] == "vmm" and r["style"] == "block"]
    st = [r["decode_tok_s"] for r in runs if r["backend"] == "static"]
    if vm and st:
        res["decode_ratio_vmm_over_static"] = statistics.mean(vm) / statistics.mean(st)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("artifacts/mini"))
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--parts", default="kernel,decode,steps")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--kv-gib", type=float, default=24.0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    path = Outputs().folder(args.out, ["bench.json"], "--out") / "bench.json"  # before the run
    on_gpu = args.device.startswith("cuda")
    res: dict = {"device": torch.cuda.get_device_name() if on_gpu else "cpu",
                 "torch": torch.__version__}

    def save() -> None:
        write_text(path, dumps(res, indent=1))

    parts = args.parts.split(",")
    if "kernel" in parts and on_gpu:
        try:
            res["kernel"] = kernel_bench()
        except Exception:  # noqa: BLE001 - keep the other parts
            res["kernel_error"] = traceback.format_exc()
        save()
    cfg = get_config(args.model)
    t0 = time.perf_counter()
    model = build_model(cfg, args.device)
    if on_gpu:
        torch.cuda.synchronize()
    res["model_build_s"] = time.perf_counter() - t0
    kv_bytes = int(args.kv_gib * GiB)
    if "decode" in parts:
        decode_part(res, model, cfg, args.batch, args.prompt_len, args.gen, args.reps, kv_bytes)
        save()
    if "steps" in parts:
        try:
            res["steps"] = (step_sweep(model, cfg, kv_bytes) if on_gpu else
                            step_sweep(model, cfg, kv_bytes, (16, 64), ((2, 32), (4, 64))))
        except Exception:  # noqa: BLE001
            res["steps_error"] = traceback.format_exc()
        save()
    print_summary(res)
    return 0


def print_summary(res: dict) -> None:
    print(f"\n== mini bench on {res.get('device')} (torch {res.get('torch')}) ==")
    for row in res.get("kernel", []):
        print(f"kernel B={row['batch']} ctx={row['ctx']:5d}: triton {row['triton_ms']:.3f} ms "
              f"({row['triton_GBps']:.0f} GB/s, err {row['triton_rel_err']:.1e}) | torch "
              f"{row['torch_ms']:.3f} ms (err {row['torch_rel_err']:.1e})")
    for r in res.get("decode", []):
        print(f"decode {r['backend']:6s} {r['style']:5s} B={r['batch']}: "
              f"{r['decode_tok_s']:.0f} tok/s, median step {r['decode_step_ms_median']:.2f} ms")
    if "decode_ratio_vmm_over_static" in res:
        print(f"decode throughput VMM/static = {res['decode_ratio_vmm_over_static']:.4f}")
    if "steps" in res:
        print(f"step sweep: {len(res['steps'])} steps recorded")
    for k in ("kernel_error", "decode_error", "steps_error"):
        if k in res:
            print(k, res[k][-800:])


if __name__ == "__main__":
    sys.exit(run_main(main))
