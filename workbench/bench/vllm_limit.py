"""What a memory limit costs real vLLM: elastic vLLM under a ``kvctl limit`` of N blocks' bytes
against stock vLLM given N blocks (``num_gpu_blocks_override``), same requests, wall time of
the wave. Runs interleaved (stock, elastic, stock, elastic, ...), each run a fresh process;
reports the elastic / stock ratio per pair, its median and min-max, and whether every run gave
the same tokens. The elastic engine keeps vLLM's default virtual budget (its whole share of
the device), so its free queue is as long as the device allows.

    python -m workbench.bench.vllm_limit --model DIR [--blocks 512] [--repeats 3] [--out DIR]
    python -m workbench.bench.vllm_limit --steps        (the step-cost sweep, no model)

``--graphs``: CUDA graphs on (``enforce_eager=False``), on a GPU. ``--kernels vllm`` (the
default where vLLM's compiled op library is loaded): vLLM's own attention backend, custom ops
and torch.compile with its default CUDA graphs; ``stand-in``: what runs without that library
(Triton attention, native ops, no compilation, full graphs for decode steps only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

from workbench.outfiles import Outputs, run_main, write_text
from workbench.settings import ENV_PREFIX
from workbench.strictjson import dumps
from workbench.units import GiB


def _prompt_ids(n: int, length: int, vocab: int) -> list[list[int]]:
    """Distinct prompts of exactly ``length`` token ids (no shared prefix)."""
    return [[(7 + 31 * i + 17 * j) % (vocab - 10) + 5 for j in range(length)] for i in range(n)]


def _llm(args, blocks: int | None):
    from vllm import LLM

    kw = dict(model=args.model, tokenizer=args.model, dtype="bfloat16", seed=0,
              max_model_len=args.max_len, max_num_seqs=args.prompts, block_size=args.block_size,
              enable_prefix_caching=True, enforce_eager=not args.graphs,
              num_gpu_blocks_override=blocks)
    if args.device == "cuda" and _kernels(args) == COMPILED:
        kw.update(gpu_memory_utilization=args.util)
    elif args.device == "cuda":
        cc: dict = {"mode": 0, "custom_ops": ["none"]}
        if args.graphs:
            cc.update(cudagraph_mode="FULL_DECODE_ONLY",
                      cudagraph_capture_sizes=[1, 2, 4, 8, 16, 32, 64])
        kw.update(gpu_memory_utilization=args.util, attention_backend="TRITON_ATTN",
                  compilation_config=cc,
                  kernel_config={"ir_op_priority": {"rms_norm": ["native"],
                                                    "fused_add_rms_norm": ["native"]}})
    return LLM(**kw)


COMPILED = "vllm"  # the kernels argument naming vLLM's own compiled ops (else: "stand-in")


def _kernels(args) -> str:
    from workbench.engines.real.vllm_build import compiled

    if args.kernels != "auto":
        return args.kernels
    return COMPILED if compiled() else "stand-in"


def _runner_name(llm) -> str:
    """The model runner vLLM chose (``v1``, ``v2``: ``plan26.runner_of``, vLLM's own flag)."""
    from workbench.adapters.vllm.plan26 import runner_of

    try:
        return runner_of(llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
                         .worker)
    except AttributeError:  # a record field, never a failed run
        return "unknown"


def _build() -> str:
    from workbench.engines.real.vllm_build import build

    return build()


def _probe(llm, unbacked: int) -> dict:
    """After start-up (graph capture included): the bytes of the null block and of a block no
    request has used. Every unbacked block reads the device's one shared scratch page, so a
    non-zero sum there means start-up wrote into the unbacked range (and landed on scratch)."""
    try:
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
            .model_runner
        caches = list(runner.kv_caches)
        n = runner.kv_cache_config.num_blocks
        sums = {}
        for name, b in (("null_block", 0), ("unbacked_block", unbacked)):
            total = 0.0
            for t in caches:
                dim = list(t.shape).index(n)
                total += float(t.select(dim, b).float().abs().sum())
            sums[name + "_abs_sum"] = total
        return sums
    except Exception as exc:  # a report field, never a failed run
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _ledger():
    from workbench.adapters.vllm import registry

    return registry.ledgers[-1][1] if registry.ledgers else None


def _kvctl_limit(kv, nbytes: int) -> dict:
    """``workbench kvctl limit`` from another process, the engine polling its control segment
    meanwhile (as its block pool does on every call) until the request is answered."""
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "limit",
                             kv.config.ipc_name, str(nbytes), "--json", "--wait", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        kv.poll_control()
        time.sleep(0.005)
    out, err = proc.communicate()
    return {"rc": proc.returncode, "out": out.strip()[-300:], "err": err.strip()[-300:]}


def _count_steps() -> dict:
    """Scheduler steps and preemptions of this process, counted at vLLM's own two methods: a
    limit that leaves fewer blocks than stock's N shows as more of both, whatever the device."""
    from vllm.v1.core.sched.scheduler import Scheduler

    seen = {"steps": 0, "preemptions": 0}
    schedule, preempt = Scheduler.schedule, Scheduler._preempt_request

    def counted_schedule(self, *a, **kw):
        seen["steps"] += 1
        return schedule(self, *a, **kw)

    def counted_preempt(self, *a, **kw):
        seen["preemptions"] += 1
        return preempt(self, *a, **kw)

    Scheduler.schedule, Scheduler._preempt_request = counted_schedule, counted_preempt
    return seen


def _profiler(args):
    """``--profile DIR``: cProfile of the wave alone (start-up left out), one file per run, so
    where a mode's extra time goes is read from the two modes' host work side by side."""
    if not args.profile:
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


def child(args) -> dict:
    """One run in this process: build, (elastic: limit to N blocks' bytes), generate once."""
    from vllm import SamplingParams

    elastic = args.child == "elastic"
    seen = _count_steps()
    t0 = time.time()
    llm = _llm(args, None if elastic else args.blocks)
    out: dict = {"mode": args.child, "init_s": round(time.time() - t0, 1),
                 "kernels": _kernels(args) if args.device == "cuda" else "cpu",
                 "build": _build(), "runner": _runner_name(llm)}
    kv = _ledger()
    if elastic:
        if kv is None:
            raise SystemExit("elastic run without a workbench ledger: is autopatch armed?")
        g = kv.geometry  # a block's bytes over every layer (a page id spans them all)
        per_block = g.page_id_bytes * g.block_bytes // g.page_size
        limit = args.blocks * per_block
        out.update(capacity_bytes=kv.capacity_bytes, num_blocks=g.num_blocks,
                   block_bytes=per_block, limit_bytes=limit, page_id_bytes=g.page_id_bytes,
                   reserve_pages=kv.config.min_reserved_pages if kv.config.prealloc else 0,
                   mapped_after_init=kv.mapped_bytes, probe=_probe(llm, g.num_blocks - 1))
        out["kvctl"] = _kvctl_limit(kv, limit)
        out["limit_state"] = kv.limit_state.outcome.value
    vocab = llm.get_tokenizer().vocab_size
    prompts = [{"prompt_token_ids": p} for p in _prompt_ids(args.prompts, args.prompt_len, vocab)]
    sp = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    before = dict(seen)
    prof = _profiler(args)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    out["gen_s"] = round(time.perf_counter() - t0, 3)
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.path.join(args.profile, f"{args.child}_{args.run}.prof"))
    out.update({k: seen[k] - before[k] for k in seen})
    ids = [list(o.outputs[0].token_ids) for o in outs]
    out["tokens"] = sum(map(len, ids))
    out["tokens_sha"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]
    out["finished"] = sum(o.finished for o in outs)
    out["cached_tokens"] = sum(o.num_cached_tokens or 0 for o in outs)  # prefix-cache hits
    if kv is not None:
        out.update(mapped_peak_pages_limit=kv.pages.limit_pages, mapped_end=kv.mapped_bytes,
                   maps=kv.count_events("map"), misses=kv.misses,
                   shortfalls=sum(p.shortfalls for p in _pools()))
        kv.check_invariants()
    stub = sys.modules.get("opstub")
    if stub is not None:
        out["opstub_calls"] = dict(stub.CALLS)
    return out


def _pools() -> list:
    from workbench.adapters.vllm import registry

    return registry.pools


def _spawn(args, mode: str, i: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if args.device == "cpu":
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE=str(args.cpu_kv_gib))
    if mode == "elastic":
        env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=f"vlimit_{os.getpid()}_{i}")
    cmd = [sys.executable, "-m", "workbench.bench.vllm_limit", "--child", mode, "--run", str(i),
           *_passthrough(args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"mode": mode, "error": f"rc {proc.returncode}", "stderr": proc.stderr[-3000:]}


def _passthrough(args) -> list[str]:
    out = ["--model", args.model, "--device", args.device]
    for k in ("blocks", "prompts", "prompt_len", "tokens", "block_size", "max_len", "util",
              "cpu_kv_gib"):
        out += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return (out + ["--kernels", args.kernels] + (["--graphs"] if args.graphs else [])
            + (["--profile", args.profile] if args.profile else []))


def wave(args) -> dict:
    for i in range(args.warmup):  # compile caches, page cache: the first runs pay for them
        for mode in ("stock", "elastic"):
            r = _spawn(args, mode, -1 - i)
            print(json.dumps({"warmup": True, **{k: v for k, v in r.items()
                                                 if k in ("mode", "gen_s", "error")}}))
    runs = []
    for i in range(args.repeats):
        for mode in ("stock", "elastic"):  # ABAB: drifts in the machine hit both alike
            r = _spawn(args, mode, i)
            r["repeat"] = i
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "stderr"}), flush=True)
            if "error" in r:
                print(r["stderr"], file=sys.stderr)
    ok = [r for r in runs if "gen_s" in r]
    pairs = [(s["gen_s"], e["gen_s"]) for s, e in zip(runs[::2], runs[1::2], strict=True)
             if "gen_s" in s and "gen_s" in e]
    ratios = [e / s for s, e in pairs]
    summary = {"blocks": args.blocks, "repeats": args.repeats, "warmup": args.warmup,
               "graphs": args.graphs, "kernels": sorted({r.get("kernels", "") for r in ok}),
               "build": sorted({r.get("build", "") for r in ok}),
               "runner": sorted({r.get("runner", "") for r in ok}),
               "device": args.device, "runs": len(runs), "failed": len(runs) - len(ok),
               "tokens_equal": len({r["tokens_sha"] for r in ok}) == 1 and len(ok) == len(runs),
               "stock_s": sorted(s for s, _ in pairs), "elastic_s": sorted(e for _, e in pairs),
               "ratios": [round(x, 3) for x in ratios]}
    for key in ("steps", "preemptions"):  # per mode: where they differ, so does the work
        summary[key] = {m: sorted({r.get(key) for r in ok if r["mode"] == m} - {None})
                        for m in ("stock", "elastic")}
    if ratios:
        summary.update(ratio_median=round(statistics.median(ratios), 3),
                       ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3),
                       goal_met=statistics.median(ratios) <= 1.10,
                       # best run of each: the estimate least moved by other load on the host
                       best_ratio=round(min(e for _, e in pairs) / min(s for s, _ in pairs), 3))
    return {"summary": summary, "runs": runs}


def profile_diff(folder: str, top: int = 15) -> list[dict]:
    """Where elastic's wave spent host time stock's did not: per function, the inner time of
    every elastic run minus every stock run (counted runs only), largest first."""
    import pstats

    total: dict[str, list[float]] = {}
    for name in sorted(os.listdir(folder)):
        mode, _, run = name.removesuffix(".prof").partition("_")
        if not name.endswith(".prof") or run.startswith("-"):  # warm-ups are -1, -2, ...
            continue
        sign = 1.0 if mode == "elastic" else -1.0
        for (file, line, fn), row in pstats.Stats(os.path.join(folder, name)).stats.items():
            key = f"{os.path.basename(file)}:{line}:{re.sub(r' at 0x[0-9a-f]+', '', fn)}"
            t = total.setdefault(key, [0.0, 0.0])
            t[0] += sign * row[2]  # inner time
            t[1] += sign * row[1]  # calls
    rows = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"function": k, "extra_s": round(v[0], 4), "extra_calls": int(v[1])}
            for k, v in rows]


def steps(args) -> dict:
    from workbench.bench import vllm_steps

    caps = [int(float(c) * GiB) for c in args.capacities.split(",")]
    rows = vllm_steps.sweep(caps, args.blocks * vllm_steps.BLOCK_BYTES)
    print(vllm_steps.table(rows))
    return {"steps": rows}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (e.g. the project's tiny Llama)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--blocks", type=int, default=512, help="N: stock's blocks, elastic's limit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="pairs run first and not counted")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--util", type=float, default=0.3, help="gpu_memory_utilization (cuda)")
    ap.add_argument("--cpu-kv-gib", type=int, default=8, help="VLLM_CPU_KVCACHE_SPACE (cpu)")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs (enforce_eager=False)")
    ap.add_argument("--kernels", choices=("auto", "vllm", "stand-in"), default="auto",
                    help="cuda: vLLM's defaults, or the stand-in's kernels (auto: by the build)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--steps", action="store_true", help="the step-cost sweep instead")
    ap.add_argument("--capacities", default="0.0625,2,41", help="GiB, for --steps")
    ap.add_argument("--out", help="write the JSON result into this folder")
    ap.add_argument("--profile", help="write a cProfile of each run's wave into this folder")
    ap.add_argument("--child", choices=("stock", "elastic"), help=argparse.SUPPRESS)
    ap.add_argument("--run", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    record = None
    if args.out and not args.child:  # checked before the run
        name = "vllm_steps.json" if args.steps else f"vllm_limit_{args.device}" \
            f"{'_graphs' if args.graphs else ''}.json"
        record = Outputs().folder(args.out, [name], "--out") / name
    if args.profile and not args.child:
        os.makedirs(Outputs().folder(args.profile, [], "--profile"), exist_ok=True)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    if args.steps:
        result = steps(args)
    else:
        if not args.model:
            from workbench.errors import ConfigError

            raise ConfigError("--model", "is needed for a wave", "pass a model folder, or "
                              "--steps for the step-cost sweep")
        result = wave(args)
        if args.profile:
            result["profile_diff"] = profile_diff(args.profile)
            for row in result["profile_diff"]:
                print(json.dumps(row))
        print(json.dumps(result["summary"]))
    if record is not None:
        write_text(record, dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
