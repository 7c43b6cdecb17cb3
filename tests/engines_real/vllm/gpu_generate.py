"""vLLM 0.26 on a CUDA GPU: greedy generation of a batch of prompts; prints one ``RESULT {json}``.

``python gpu_generate.py MODEL_DIR`` with, in the environment, ``WORKBENCH_KV_AUTOPATCH=1`` for
the elastic run (the ``.pth`` file patches vLLM as it imports) and these knobs of this script:

* ``GEN_UTIL``: ``gpu_memory_utilization`` (stock vLLM also checks it against free memory);
* ``GEN_PROMPTS`` / ``GEN_TOKENS``: how many prompts, tokens per prompt;
* ``GEN_LIMIT_AT`` / ``GEN_LIMIT``: once the pool maps more than ``GEN_LIMIT_AT`` bytes, another
  process runs ``workbench kvctl limit <pool> GEN_LIMIT`` (mid-run);
* ``GEN_GO_FILE``: wait for this file before generating (two engines start, then both run).

The weights are set from a seeded generator after loading, so two processes hold the same model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


def _prompts(n: int) -> list[str]:
    words = ["import os", "def hello(world):", "class Foo(object):", "for i in range(10):",
             "while True:", "x = [i * i for i in", "return self.", "with open(path) as f:"]
    return [" ".join(words[(i + j) % len(words)] for j in range(1 + i % 5)) for i in range(n)]


def _seed_weights(llm):
    import torch

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker \
        .model_runner
    g = torch.Generator(device="cpu").manual_seed(1234)
    with torch.no_grad():
        for name, p in runner.get_model().named_parameters():
            w = (1.0 + 0.1 * torch.randn(p.shape, generator=g)) if name.endswith("norm.weight") \
                else torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            p.copy_(w.to(p.dtype))
    return runner


class Sampler(threading.Thread):
    """Reads the ledger's mapped bytes while the engine runs; fires the kvctl limit once."""

    def __init__(self, kv, limit_at: int | None, limit: str | None):
        super().__init__(daemon=True)
        self.kv, self.limit_at, self.limit = kv, limit_at, limit
        self.samples: list[int] = []
        self.kvctl: dict | None = None
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            mapped = self.kv.pages.mapped_pages * self.kv.geometry.page_id_bytes
            self.samples.append(mapped)
            if self.limit_at is not None and self.kvctl is None and mapped >= self.limit_at:
                proc = subprocess.run(
                    [sys.executable, "-m", "workbench", "kvctl", "limit", self.kv.config.ipc_name,
                     self.limit, "--json", "--wait", "20"], capture_output=True, text=True)
                self.kvctl = {"rc": proc.returncode, "out": proc.stdout.strip(),
                              "err": proc.stderr.strip()[-400:], "mapped_at": mapped}
            time.sleep(0.002)


def _kvctl_list() -> list:
    proc = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "list", "--json"],
                          capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else [proc.stderr[-400:]]


def _build(model: str):
    from vllm import LLM

    return LLM(model=model, tokenizer=model, dtype="bfloat16", enforce_eager=True, seed=0,
               gpu_memory_utilization=float(os.environ.get("GEN_UTIL", "0.3")),
               max_model_len=512, max_num_seqs=32, block_size=16, enable_prefix_caching=True,
               attention_backend="TRITON_ATTN",
               compilation_config={"mode": 0, "custom_ops": ["none"]},
               kernel_config={"ir_op_priority": {"rms_norm": ["native"],
                                                 "fused_add_rms_norm": ["native"]}})


def _describe_pool(out: dict, kv, caches) -> None:
    base, end = kv.space.base, kv.space.base + kv.space.size
    out["views_in_pool"] = all(base <= t.data_ptr() < end for t in caches)
    out["layout"], out["page_id_bytes"] = kv.geometry.layout.value, kv.geometry.page_id_bytes
    out["capacity"] = kv.capacity_bytes
    out["mapped_idle"] = kv.mapped_bytes
    out["kvctl_list"] = _kvctl_list()


def main(model: str) -> None:
    import torch
    from vllm import SamplingParams

    t0 = time.time()
    llm = _build(model)
    out: dict = {"init_s": round(time.time() - t0, 1)}
    runner = _seed_weights(llm)
    from workbench.adapters import boot

    out["patches"] = [r["patch"] + ":" + r["status"] for r in boot.status()]
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    out["runner"] = "v2" if worker.use_v2_model_runner else "v1"  # vLLM's own choice
    out["runner_class"] = f"{type(runner).__module__}.{type(runner).__name__}"
    out["workbench_runner"] = getattr(worker, "workbench_runner", None)  # the seam that fired
    from workbench.adapters.vllm import registry

    # V1's seam keeps the ledger on the runner; Model Runner V2's only registers it
    kv = getattr(runner, "workbench_ledger", None) or registry.ledger_for(
        runner.kv_cache_config.num_blocks)
    out["budget"] = getattr(worker, "workbench_budget", None)
    out["num_blocks"] = runner.kv_cache_config.num_blocks
    caches = list(runner.kv_caches)
    out["kv_shape"] = list(caches[0].shape)
    out["kv_stride"] = list(caches[0].stride())
    sampler = None
    if kv is not None:
        _describe_pool(out, kv, caches)
        limit_at = os.environ.get("GEN_LIMIT_AT")
        sampler = Sampler(kv, int(limit_at) if limit_at else None, os.environ.get("GEN_LIMIT"))
    go = os.environ.get("GEN_GO_FILE")
    if go:
        with open(go + f".ready.{os.getpid()}", "w") as f:
            f.write("ready")
        while not os.path.exists(go):
            time.sleep(0.05)
    n, tokens = int(os.environ.get("GEN_PROMPTS", "48")), int(os.environ.get("GEN_TOKENS", "200"))
    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    free0 = torch.cuda.mem_get_info()[0]
    if sampler is not None:
        sampler.start()
    t0 = time.time()
    outs = llm.generate(_prompts(n), sp)
    out["gen_s"] = round(time.time() - t0, 2)
    if sampler is not None:
        sampler.stop = True
        sampler.join()
        out["mapped_peak"], out["mapped_after"] = max(sampler.samples), kv.mapped_bytes
        kv.reap(wait=True)  # pages retired by the last frees, released once kernels finished
        out["mapped_settled"] = kv.mapped_bytes
        out["mapped_samples"] = len(set(sampler.samples))
        out["kvctl"] = sampler.kvctl
        out["limit_state"] = kv.limit_state.outcome.value
        out["limit_bytes"] = kv.limit_bytes
        # every VMM map: on the request path ("map") and into the reserve ("prealloc"), which
        # is where most pages come from once the pool takes backed blocks first
        out["maps"] = kv.count_events("map") + kv.count_events("prealloc")
        out["unmaps"] = kv.count_events("unmap")
        out["misses"] = kv.misses
        kv.check_invariants()
    out["free_delta_during"] = free0 - torch.cuda.mem_get_info()[0]
    out["finished"] = [o.finished for o in outs].count(True)
    out["token_ids"] = [list(o.outputs[0].token_ids) for o in outs]
    stub = sys.modules.get("opstub")  # the GPU recipe's op stand-in, when it is in use
    out["opstub_calls"] = stub.CALLS if stub is not None else {}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
