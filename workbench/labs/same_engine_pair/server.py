"""Two real elastic vLLMs (or SGLangs, radix cache off) on one device sharing one GPU budget
(seed 000 §7 on a real engine).

Both processes start with the same ``WORKBENCH_KV_GPU_BUDGET``: a total a little under what one
engine maps at its peak, so whoever is busy fills the budget and the other stays at its floor.
Phases (prefix caching off, no reserve, so a drained engine's empty pages unmap at once):

* **idle**  both idle;  **A**  A busy, B idle;  **B**  A drained and idle, B busy (B maps what A
  released);  not in quick: **both** both busy: together at the budget, neither over it; **E**
  B busy, A closed early on (SIGTERM, then SIGKILL after the grace): does A's share come back
  to the budget, and does B grow past its share in *both*? Then ``kvctl budget --gc``.

Every 50 ms one thread reads both control segments (mapped bytes) and the budget segment (its
total, what each holder holds) and the device's free memory; ``workbench kvctl budget --json``
runs as a real subprocess in the middle of each phase. The pools keep no share of the budget
free (``gpu_utilization`` 1: the budget is the headroom) and park no reserve pages. No request
may be lost, and no sample may show more held than the total.
"""

from __future__ import annotations

import time
from typing import Any

from workbench.engines.real.client import Sampling
from workbench.engines.real.procs import descendants
from workbench.labs.kit import server_rig as rig
from workbench.labs.kit.budget_pair import Phases, Sampler, close_all, outcomes
from workbench.units import MiB

PAGE_ID = 4 * MiB  # the tiny model: 2 layers x one 2 MiB page each
BUDGET = 5 * PAGE_ID  # both engines' floors (one page id each) + 3 page ids to contend for
# SGLang's tiny model: 4 layers x K and V, one 2 MiB page each (1024 token slots a page id)
PAGE_IDS = {"vllm": PAGE_ID, "sglang": 16 * MiB}


def run(backend: str, quick: bool = False, kind: str = "vllm",
        phase_s: float | None = None) -> dict[str, Any]:
    py = rig.python_for("same-engine-pair", kind)
    page = PAGE_IDS.get(kind, PAGE_ID)  # a kind not listed: vLLM's layout
    budget = 5 * page
    root = rig.workroot()
    dev = rig.device_of(backend)
    n, tokens, default_s = (12, 96, 12.0) if quick else (16, 128, 25.0)
    phase_s = phase_s or default_s
    # the budget is the headroom: no share of it kept free (gpu_utilization 1), no reserve
    knobs = {"gpu_budget": str(budget), "gpu_utilization": "1.0", "min_reserved_pages": "0",
             "max_reserved_pages": "0"}
    model = rig.model_dir(py, root, kind)
    a, b = (rig.engine(name, backend, model, py, root, elastic=True, kind=kind, max_num_seqs=n,
                       prefix_caching=False, knobs=dict(knobs), **rig.lab_pool(kind))
            for name in ("A", "B"))
    sampler = Sampler([a, b], dev, budget)
    try:
        rig.start_all([a, b])
        for e in (a, b):
            e.sampling = e._sender.sampling = Sampling()
        pids = {e.name: [e.process.pid, *descendants(e.process.pid)] for e in (a, b)}
        sampler.start()
        time.sleep(1.0)
        ph = Phases(sampler, n, tokens, phase_s)
        ph.busy("A", [a])
        ph.busy("B", [b])
        counters = {}
        if not quick:
            ph.busy("both", [a, b])
            counters["A"] = rig.counters(a)
            ph.exit_first(a, b)  # A exits while B is busy
        counters.update({e.name: rig.counters(e) for e in (a, b) if e.name not in counters})
        sampler.stop.set()
        sampler.join()
        return {"backend": backend, "device": dev, "engine": kind, "budget": budget,
                "page_id_bytes": page,
                "in_flight": n, "max_tokens": tokens, "phase_s": phase_s,
                "phases": ph.names, "pids": pids,
                **outcomes(ph, tokens, pids), "counters": counters,
                "kvctl_budget": ph.budgets, "ttft_ms": ph.ttft, "samples": sampler.rows}
    finally:
        close_all(sampler, (a, b), budget, root)
