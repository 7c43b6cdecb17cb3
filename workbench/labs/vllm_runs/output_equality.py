"""Output equality on a real vLLM (seed 000 §13): the same tokens from elastic and stock KV,
greedy and seeded sampling, prefix caching on (a second wave hits the first's blocks), and on a
small pool under a memory limit where requests are preempted and recomputed."""

from __future__ import annotations

import shutil
from typing import Any

from workbench.engines.real.client import Sampling
from workbench.labs.vllm_runs import rig

WAVES = (("greedy", Sampling()), ("greedy, prefix hits", Sampling()),
         ("seeded sampling", Sampling(temperature=0.8, seed=1234)))


def _compare(case: str, ref: list[list[int]], got: list[list[int]]) -> dict[str, Any]:
    diff = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b]
    return {"case": case, "prompts": len(ref), "equal": len(ref) - len(diff),
            "first_diff": diff[0] if diff else None,
            "lost": sum(1 for t in got if not t) + sum(1 for t in ref if not t)}


def _pair(tag: str, backend: str, model: str, py: str, root, prompts, n: int, waves, *,
          knobs: dict[str, str] | None = None, **kw) -> dict[str, Any]:
    stock = rig.engine(f"oe-{tag}-stock", backend, model, py, root, elastic=False, **kw)
    elastic = rig.engine(f"oe-{tag}-elastic", backend, model, py, root, elastic=True,
                         knobs=knobs or {}, **kw)
    rows, extra = [], {}
    try:
        rig.start_all([stock, elastic])
        for w, (label, sampling) in enumerate(waves):
            outs = [rig.send(e, prompts, n, sampling, first_rid=1000 * w)
                    for e in (stock, elastic)]
            rows.append({"pool": tag, **_compare(label, *outs)})
        extra = {"stock": rig.counters(stock), "elastic": rig.counters(elastic),
                 "elastic_peak_mapped": max((s.mapped_bytes for s in elastic.samples),
                                            default=0),
                 "elastic_capacity": elastic.kv_pool.capacity_bytes}
    finally:
        stock.close()
        elastic.close()
    return {"rows": rows, "engines": extra}


def run(backend: str, quick: bool = False, limit: str | None = None) -> dict[str, Any]:
    py = rig.python_for("output-equality")
    root = rig.workroot()
    try:
        model = rig.model_dir(py, root)
        n_prompts, n_tokens = (4, 24) if quick else (8, 48)
        prompts = rig.prompts(n_prompts, shared=64, tail=8, seed=0)
        big = _pair("default", backend, model, py, root, prompts, n_tokens, WAVES)
        # the same pool size for both; elastic under a one-page limit that forces preemption
        blocks = 64 if rig.device_of(backend) == "cpu" else 256
        lim = limit or "2MiB"
        small = _pair("small", backend, model, py, root, prompts, 2 * n_tokens, WAVES[:1],
                      num_gpu_blocks=blocks, max_num_seqs=n_prompts,
                      knobs={"memory_limit": lim, "min_reserved_pages": "0",
                             "max_reserved_pages": "1"})
        return {"backend": backend, "device": rig.device_of(backend), "model": "tiny-llama",
                "prompts": n_prompts, "max_tokens": n_tokens, "small_blocks": blocks,
                "limit": lim, "rows": big["rows"] + small["rows"],
                "engines": {"default": big["engines"], "small": small["engines"]}}
    finally:
        shutil.rmtree(root, ignore_errors=True)
