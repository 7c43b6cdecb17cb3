"""SGLang 0.5.16's server on the GPU, stock and with autopatch, five servers on one GPU.

Every server loads the same random Llama-shaped weights (``--load-format dummy``), runs Triton
attention and the pytorch sampler in SGLang's deterministic mode (batch-invariant kernels: which
requests share a step changes no sum, so a differing token can only come from the KV layout),
and gets prompts by token id. ``stock`` and ``small`` are stock SGLang with the full and with a
small KV pool; ``sgl16`` is elastic (autopatch) with the full pool's capacity; ``sha`` and ``shb``
are elastic under one GPU budget. Phases:

1. **tokens**: the same prompts (groups sharing a 200-token prefix; greedy and seeded sampling)
   through all five; ``kvctl list`` from another process.
2. **limit**: ABAB rounds of 32 concurrent requests, the radix caches flushed before each:
   stock vs elastic, and ``small`` vs elastic under a ``kvctl limit`` of ``small``'s KV bytes,
   set before the round and set mid-round; wall times, mapped bytes and the GPU's free memory.
3. **share**: ``sha`` fills, ``shb`` runs while ``sha``'s cache holds its pages, then ``sha``
   flushes and ``shb`` runs again: what one released the other maps, the two never over the
   budget.

Writes ``OUT/result.json`` and each server's log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from load import MiB, flush, free_gpu, generate, kvctl, load_round, prompts, ratios, segment

LAYERS, KV_HEADS, HEAD_DIM = 4, 8, 128
TOKEN_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16: 16 KiB a token
PORTS = {"stock": 30000, "sgl16": 30001, "small": 30002, "sha": 30003, "shb": 30004}
ELASTIC = ("sgl16", "sha", "shb")
SHARED = ("sha", "shb")  # under one GPU budget


def tiny_llama(path: Path) -> Path:
    from transformers import LlamaConfig

    path.mkdir(parents=True, exist_ok=True)
    LlamaConfig(hidden_size=1024, num_hidden_layers=LAYERS, num_attention_heads=8,
                num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=2048,
                vocab_size=4096, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                torch_dtype="bfloat16", tie_word_embeddings=False,
                architectures=["LlamaForCausalLM"]).save_pretrained(path)
    return path


def start(name: str, model: Path, out: Path, tokens: int, budget: int):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    if name in ELASTIC:
        env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=name,
                   WORKBENCH_KV_GPU_UTILIZATION="0.45")
    if name in SHARED:
        env.update(WORKBENCH_KV_GPU_BUDGET=str(budget))
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
           "--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend",
           "pytorch", "--grammar-backend", "none", "--skip-tokenizer-init", "--disable-cuda-graph",
           "--skip-server-warmup", "--mem-fraction-static", "0.3", "--max-total-tokens",
           str(tokens), "--random-seed", "0", "--enable-deterministic-inference",
           "--host", "127.0.0.1", "--port", str(PORTS[name]), "--context-length", "4096",
           "--log-level", "info"]
    log = open(out / f"{name}.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_ready(name: str, proc, limit_s: float) -> float:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server {name} exited with {proc.returncode}")
        try:
            generate(PORTS[name], [[1, 5, 7]], {"max_new_tokens": 2, "temperature": 0})
            return round(time.time() - t0, 1)
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(1.0)
    raise RuntimeError(f"server {name} not ready in {limit_s} s")


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def tokens_phase() -> dict:
    ids = prompts(2, 4, 200, 24)
    greedy = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    seeded = {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 1234,
              "ignore_eos": True}
    out: dict = {"idle": {n: segment(n) for n in ELASTIC}}
    got = {n: {"greedy": generate(p, ids, greedy)[0], "seeded": generate(p, ids, seeded)[0]}
           for n, p in PORTS.items()}
    for kind in ("greedy", "seeded"):
        ref = got["stock"][kind]
        out[kind] = {n: sum(x == y for x, y in zip(ref, g[kind], strict=True))
                     for n, g in got.items() if n != "stock"}
    out["prompts"] = len(ids)
    out["kvctl_list"] = kvctl("list")
    return out


def limit_to(name: str, nbytes: int) -> str:
    return kvctl("limit", name, str(nbytes), "--wait", "0").strip()[-300:]


def limit_phase(reps: int, small_bytes: int) -> dict:
    ids = prompts(8, 4, 1024, 256, seed=7)
    cap = segment("sgl16")["capacity"]
    watch = ["sgl16"]
    walls: dict[str, list[float]] = {k: [] for k in ("stock", "elastic", "small", "limited",
                                                     "midrun")}
    rounds = []

    def one(kind: str) -> None:
        port = PORTS["sgl16"] if kind in ("elastic", "limited", "midrun") else PORTS[kind]
        if port == PORTS["sgl16"]:
            limit_to("sgl16", small_bytes if kind == "limited" else cap)
        flush(port)
        time.sleep(0.5)
        then = (lambda: limit_to("sgl16", small_bytes)) if kind == "midrun" else None
        r = load_round(port, ids, 256, watch, at_s=1.0, then=then)
        r.update(kind=kind, after=segment("sgl16"))
        rounds.append(r)
        walls[kind].append(r["wall_s"])
        print(f"limit phase: {kind} {r['done']}/{r['requests']} in {r['wall_s']} s", flush=True)

    for rep in range(reps):  # pairs alternate which side runs first
        for pair in (("stock", "elastic"), ("small", "limited")):
            for kind in (pair if rep % 2 == 0 else pair[::-1]):
                one(kind)
        one("midrun")
    limit_to("sgl16", cap)
    return {"rounds": rounds, "walls": walls, "small_kv_mib": small_bytes // MiB,
            "elastic_over_stock": ratios(walls["elastic"], walls["stock"]),
            "limited_over_small": ratios(walls["limited"], walls["small"]),
            "midrun_over_small": ratios(walls["midrun"], walls["small"])}


def share_phase(budget: int) -> dict:
    from load import Sampler

    ids = prompts(12, 4, 1024, 192, seed=11)
    a, b = SHARED
    for n in SHARED:
        flush(PORTS[n])
    steps: dict = {}
    with Sampler(list(SHARED)) as s:
        steps["a_fills"] = load_round(PORTS[a], ids, 256, list(SHARED))
        steps["b_while_a_holds"] = load_round(PORTS[b], ids, 256, list(SHARED))
        steps["a_flushed"] = flush(PORTS[a])
        flush(PORTS[b])
        time.sleep(1.0)
        steps["after_flush"] = {n: segment(n) for n in SHARED}
        steps["b_after_a_flushed"] = load_round(PORTS[b], ids, 256, list(SHARED))
    steps["whole"] = s.peaks()
    steps["timeline"] = s.rows[:: max(1, len(s.rows) // 400)]
    steps["budget_mib"] = budget // MiB
    steps["kvctl_budget"] = kvctl("budget", "--json")
    return steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--total-tokens", type=int, default=262144)
    ap.add_argument("--small-tokens", type=int, default=12288)
    ap.add_argument("--budget-mib", type=int, default=1024)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout still writes the result
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_llama(Path("/tmp/sgl_tiny"))
    budget = a.budget_mib * MiB
    result: dict = {"free_gpu_start_mib": free_gpu() // MiB, "budget_mib": a.budget_mib,
                    "token_bytes": TOKEN_BYTES}
    t0 = time.time()
    procs = {n: start(n, model, out, a.small_tokens if n == "small" else a.total_tokens, budget)
             for n in PORTS}
    try:
        result["ready_s"] = {n: wait_ready(n, p, 300) for n, p in procs.items()}
        result["all_up_s"] = round(time.time() - t0, 1)
        result["free_gpu_all_up_mib"] = free_gpu() // MiB
        print("all up", result["ready_s"], flush=True)
        result["tokens"] = tokens_phase()
        print("tokens", {k: result["tokens"][k] for k in ("greedy", "seeded")}, flush=True)
        result["limit"] = limit_phase(a.reps, a.small_tokens * TOKEN_BYTES)
        result["share"] = share_phase(budget)
    except Exception as err:  # noqa: BLE001 - reported with the logs
        result["error"] = repr(err)
    finally:
        for p in procs.values():
            stop(p)
        result["wall_s"] = round(time.time() - t0, 1)
        (out / "result.json").write_text(json.dumps(result, indent=1))
    brief = {k: v for k, v in result.items() if k not in ("limit", "share")}
    if "limit" in result:
        brief["limit"] = {k: v for k, v in result["limit"].items() if k != "rounds"}
    if "share" in result:
        brief["share"] = {k: v for k, v in result["share"].items() if k != "timeline"}
    print(json.dumps(brief, indent=1))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
