"""Cross-engine on real engines (seed 000 §8 on the GPU): one elastic vLLM and one elastic SGLang
(each a tiny random Llama) on one device under one ``WORKBENCH_KV_GPU_BUDGET``.

The two share no metadata: vLLM counts blocks in its block manager, SGLang token slots in its
allocator and radix cache; what they share is the device and the budget segment each charges
every page to. Phases (the budget under what either maps alone at its load, so the busy one
fills it and the idle one sits at its floor):

* **idle**  both idle;  **vllm**  vLLM busy, SGLang idle;  **sglang**  vLLM drained (prefix
  caching off: its freed blocks unmap at once), SGLang busy: it maps what vLLM released; then
  SGLang's radix cache is flushed (``POST /flush_cache``): a drained SGLang keeps its cached
  tokens' pages until then;  **vllm again**  vLLM busy: it maps what SGLang released;  not in
  quick: **both**  both busy, together at the budget, neither over it.

One thread reads both control segments, the budget segment (its total, each holder's bytes) and
the device's free memory every 50 ms; ``workbench kvctl budget --json`` runs as a subprocess in
the middle of each phase. No request may be lost, no reading may show more held than the total.
"""

from __future__ import annotations

import time
from typing import Any

from workbench.engines.real.client import Sampling
from workbench.engines.real.procs import descendants
from workbench.labs.kit import server_rig as rig
from workbench.labs.kit.budget_pair import Phases, Sampler, close_all, outcomes
from workbench.units import MiB

# the tiny models at 32 requests of ~350 tokens in flight: vLLM's (4 KiB a token) ~44 MiB,
# SGLang's (16 KiB a token) ~175 MiB; the budget sits above vLLM's and under SGLang's need, so
# what SGLang gets depends on what vLLM gave back, and the reverse through the flush
BUDGET = 64 * MiB
ENGINES = ("vllm", "sglang")  # each engine's name is its kind
PREFIX_CACHING = {"vllm": False, "sglang": True}  # as the runner always ran them


def _engines(backend: str, root, n: int, budget: int) -> list:
    knobs = {"gpu_budget": str(budget), "gpu_utilization": "1.0", "min_reserved_pages": "0",
             "max_reserved_pages": "0"}
    out = []
    for kind in ENGINES:
        py = rig.python_for("cross-engine", kind)
        out.append(rig.engine(kind, backend, rig.model_dir(py, root, kind), py, root,
                              elastic=True, kind=kind, max_num_seqs=n, knobs=dict(knobs),
                              prefix_caching=PREFIX_CACHING[kind], **rig.lab_pool(kind)))
    return out


def flush(sampler: Sampler, s) -> dict[str, Any]:
    """SGLang drained: its radix cache dropped, its pages back to the budget."""
    before = s.kv_pool.mapped_bytes
    answer = s.flush_cache()
    time.sleep(1.5)  # the freed slots' pages unmap
    sampler.phase = "sglang flushed"
    time.sleep(0.5)
    return {**answer, "mapped_before": before, "mapped_after": s.kv_pool.mapped_bytes}


def run(backend: str, quick: bool = False, budget: int = BUDGET,
        phase_s: float | None = None) -> dict[str, Any]:
    root = rig.workroot()
    dev = rig.device_of(backend)
    n, tokens = 32, 128
    phase_s = phase_s or (10.0 if quick else 20.0)
    v, s = _engines(backend, root, n, budget)
    sampler = Sampler([v, s], dev, budget)
    try:
        rig.start_all([v, s])
        for e in (v, s):
            e.sampling = e._sender.sampling = Sampling()
        pids = {e.name: [e.process.pid, *descendants(e.process.pid)] for e in (v, s)}
        pages = {e.name: (e.kv_pool.info().page_id_bytes if e.kv_pool.info() else 0)
                 for e in (v, s)}
        sampler.start()
        time.sleep(1.0)
        ph = Phases(sampler, n, tokens, phase_s)
        ph.busy("vllm", [v])
        ph.busy("sglang", [s])
        flushed = flush(sampler, s)
        ph.busy("vllm again", [v])
        if not quick:
            ph.busy("both", [v, s])
        sampler.stop.set()
        sampler.join()
        return {"backend": backend, "device": dev, "engine": "vllm+sglang", "budget": budget,
                "page_id_bytes": pages, "in_flight": n, "max_tokens": tokens,
                "phase_s": phase_s, "phases": ph.names, "pids": pids, "flush": flushed,
                **outcomes(ph, tokens, pids),
                "counters": {e.name: rig.counters(e) for e in (v, s)},
                "kvctl_budget": ph.budgets, "ttft_ms": ph.ttft, "samples": sampler.rows}
    finally:
        close_all(sampler, (v, s), budget, root)
