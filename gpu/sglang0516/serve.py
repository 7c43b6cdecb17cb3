"""SGLang 0.5.16's server on the GPU, stock and with autopatch, side by side on one GPU.

Both servers load the same random Llama-shaped weights (``--load-format dummy``), run Triton
attention and the pytorch sampler in SGLang's deterministic mode (batch-invariant kernels: which
requests share a step changes no sum, so a differing token can only come from the KV layout),
and get the same prompts by token id: groups sharing long
prefixes (the radix cache's case), greedy and seeded sampling. The elastic one's pool is read
from its control segment (``kvctl list``, mapped bytes) while a load runs; a ``kvctl limit`` from
another process lands mid-run. Writes ``OUT/result.json`` and each server's log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

MiB = 1 << 20


def tiny_llama(path: Path) -> Path:
    from transformers import LlamaConfig

    path.mkdir(parents=True, exist_ok=True)
    LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=8, head_dim=128, intermediate_size=2048, vocab_size=4096,
                max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                torch_dtype="bfloat16", tie_word_embeddings=False,
                architectures=["LlamaForCausalLM"]).save_pretrained(path)
    return path


def start(name: str, model: Path, port: int, out: Path, elastic: bool, total_tokens: int):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    if elastic:
        env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=name,
                   WORKBENCH_KV_GPU_UTILIZATION="0.45")
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
           "--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend",
           "pytorch", "--grammar-backend", "none", "--skip-tokenizer-init", "--disable-cuda-graph",
           "--skip-server-warmup", "--mem-fraction-static", "0.3", "--max-total-tokens",
           str(total_tokens), "--random-seed", "0",
           "--enable-deterministic-inference", "--host", "127.0.0.1", "--port", str(port),
           "--context-length", "4096", "--log-level", "info"]
    log = open(out / f"{name}.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def post(port: int, path: str, body: dict, timeout: float = 300.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(port: int, proc, limit_s: float) -> float:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server on {port} exited with {proc.returncode}")
        try:
            post(port, "/generate", {"input_ids": [1, 5, 7], "sampling_params":
                                     {"max_new_tokens": 2, "temperature": 0}}, timeout=60)
            return time.time() - t0
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(1.0)
    raise RuntimeError(f"server on {port} not ready in {limit_s} s")


def prompts(n_groups: int, per_group: int, prefix: int, tail: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        shared = [rng.randrange(3, 4096) for _ in range(prefix)]
        out += [shared + [rng.randrange(3, 4096) for _ in range(tail)] for _ in range(per_group)]
    return out


def generate(port: int, ids: list[list[int]], params: dict) -> tuple[list[list[int]], float]:
    t0 = time.time()
    res = post(port, "/generate", {"input_ids": ids, "sampling_params": params})
    return [r["output_ids"] for r in res], time.time() - t0


def segment(name: str) -> dict | None:
    from workbench.core import control

    info = control.read_segment(name)
    if info is None:
        return None
    return {k: int(getattr(info, k)) for k in ("capacity", "mapped", "used_blocks", "limit")}


def kvctl(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "workbench", "kvctl", *args], capture_output=True,
                       text=True, timeout=120)
    return (p.stdout + p.stderr)[-3000:]


def free_gpu() -> int:
    import torch

    return int(torch.cuda.mem_get_info(0)[0])


def load_round(port: int, name: str | None, n: int, limit_at: float | None) -> dict:
    """``n`` concurrent requests (one per thread); the pool and the GPU sampled as they run."""
    ids = prompts(n // 4, 4, 1024, 256, seed=7)
    failed, done = [], []
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def one(i):
        try:
            post(port, "/generate", {"input_ids": ids[i], "sampling_params": {
                "max_new_tokens": 256, "temperature": 0, "ignore_eos": True}})
            done.append(i)
        except Exception as err:  # noqa: BLE001 - counted
            failed.append(repr(err)[:200])

    def sample():
        while not stop.is_set():
            seg = segment(name) if name else None
            samples.append((time.time(), seg["mapped"] if seg else 0, free_gpu()))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
    for t in threads:
        t.start()
    limit_out = None
    if limit_at is not None and name:
        time.sleep(limit_at)
        seg = segment(name)
        want = max(seg["mapped"] // 2, 64 * MiB)
        limit_out = {"bytes": want, "at_s": round(time.time() - t0, 2),
                     "kvctl": kvctl("limit", name, str(want), "--wait", "0")[-400:]}
    for t in threads:
        t.join()
    wall = time.time() - t0
    stop.set()
    sampler.join()
    mapped = [m for _, m, _ in samples]
    free = [f for _, _, f in samples]
    return {"requests": len(ids), "done": len(done), "failed": failed, "wall_s": round(wall, 3),
            "mapped_min_mib": min(mapped) // MiB if mapped else None,
            "mapped_max_mib": max(mapped) // MiB if mapped else None,
            "free_gpu_min_mib": min(free) // MiB, "free_gpu_max_mib": max(free) // MiB,
            "limit": limit_out, "after": segment(name) if name else None}


def exercise(port: int, name: str | None, reps: int) -> dict:
    ids = prompts(2, 4, 200, 24)
    greedy = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    seeded = {"max_new_tokens": 48, "temperature": 0.8, "top_p": 0.9, "sampling_seed": 1234,
              "ignore_eos": True}
    out: dict = {"segment_idle": segment(name) if name else None}
    out["greedy"], out["greedy_s"] = generate(port, ids, greedy)
    try:
        out["seeded"], out["seeded_s"] = generate(port, ids, seeded)
    except Exception as err:  # noqa: BLE001 - reported; greedy still compares
        out["seeded"], out["seeded_error"] = [], repr(err)[:300]
    if name:
        out["kvctl_list"] = kvctl("list")
    out["rounds"] = [load_round(port, name, 32, None) for _ in range(reps)]
    if name:
        out["limited_round"] = load_round(port, name, 32, limit_at=1.5)
    return out


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--total-tokens", type=int, default=262144)
    a = ap.parse_args()
    out = Path(a.out)
    model = tiny_llama(Path("/tmp/sgl_tiny"))
    result: dict = {"free_gpu_start_mib": free_gpu() // MiB}
    t0 = time.time()
    procs = {"stock": start("stock", model, 30000, out, False, a.total_tokens),
             "sgl16": start("sgl16", model, 30001, out, True, a.total_tokens)}
    try:
        for key, port in (("stock", 30000), ("sgl16", 30001)):
            result[f"{key}_ready_s"] = round(wait_ready(port, procs[key], 200), 1)
            print(f"{key} ready after {result[key + '_ready_s']} s", flush=True)
        result["both_up_s"] = round(time.time() - t0, 1)
        result["free_gpu_both_up_mib"] = free_gpu() // MiB
        result["stock"] = exercise(30000, None, a.reps)
        print("stock done", json.dumps(result["stock"]["rounds"]), flush=True)
        result["elastic"] = exercise(30001, "sgl16", a.reps)
        print("elastic done", flush=True)
        s, e = result["stock"], result["elastic"]
        result["greedy_equal"] = sum(x == y for x, y in zip(s["greedy"], e["greedy"], strict=False))
        result["seeded_equal"] = sum(x == y for x, y in zip(s["seeded"], e["seeded"], strict=False))
        result["prompts"] = len(s["greedy"])
    except Exception as err:  # noqa: BLE001 - reported with the logs
        result["error"] = repr(err)
    finally:
        for p in procs.values():
            stop(p)
        (out / "result.json").write_text(json.dumps(result, indent=1))
    brief = {k: v for k, v in result.items() if k not in ("stock", "elastic")}
    for key in ("stock", "elastic"):
        if key in result:
            r = result[key]
            brief[key] = {"rounds_wall_s": [x["wall_s"] for x in r["rounds"]],
                          "rounds": r["rounds"], "limited": r.get("limited_round"),
                          "segment_idle": r.get("segment_idle"), "kvctl": r.get("kvctl_list")}
    print(json.dumps(brief, indent=1))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
