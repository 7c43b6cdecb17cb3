"""Tiered retrieval (seed 003 E5, LMCache-style tiers modelled, not measured): is a cache beyond
HBM cheaper than prefilling again?

* **Five groups**, one factor at a time, on the simulated vLLM-like engine with the tier
  connector (:mod:`workbench.tiers.sim`). Each probe is a document plus a new question, one
  second after a *warm* request that prefilled the same document with another question:
  *baseline* (no external cache, prefix caching off), *HBM* (prefix caching on: a local hit),
  *CPU* (prefix caching off, the connector's pinned-DRAM tier holds the document), *L2* (a second
  instance sharing the remote store prefilled it: this instance's DRAM misses, the store hits —
  the seed's "compatible new instance") and *all miss* (the connector on, but the probes'
  documents were never seen: only the lookup and the save are paid). TTFT is split into wait,
  lookup, retrieve, H2D and the remaining prefill.
* On ``gpu`` and ``host`` the groups run on the mini engine with a real host tier
  (:mod:`.mini`): baseline, HBM, CPU and all miss measured; L2 not run.
* **Crossover**: for prompt lengths, chunk sizes and store bandwidths, the retrieval from the
  store against a full recompute, with the break-even bandwidth in closed form.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from workbench.engines.models import get_model
from workbench.engines.sched.request import Request
from workbench.engines.sim.kvsetup import static_pool
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.engines.sim.workloads import VOCAB
from workbench.labs.kit.base import Progress
from workbench.labs.kit.steptime import prefill_s
from workbench.tiers import TierCosts, make_stack, make_store
from workbench.tiers.presets import tier_costs
from workbench.tiers.sim import TierConnector
from workbench.units import GiB

if TYPE_CHECKING:
    from workbench.labs.tiered_retrieval.params import TieredRetrievalParams

PARTS = ("wait", "lookup", "retrieve", "h2d", "prefill")  # where a probe's TTFT goes
GROUPS = ("baseline", "hbm", "cpu", "l2", "all-miss")


def costs(p: TieredRetrievalParams, **over: Any) -> TierCosts:
    c = replace(tier_costs(p.costs), chunk_tokens=p.chunk_tokens, remote_bw=p.remote_gbps * 1e9,
                meta_s=p.meta_ms * 1e-3)
    if p.costs == "assumed":
        c = replace(c, pcie_bw=p.pcie_gbps * 1e9)
    return replace(c, **over)


def workload(p: TieredRetrievalParams, seed: int, cold: bool,
             burst: bool = False) -> list[Request]:
    """warm_k at 2k s and probe_k at 2k+1 s on document k; ``cold``: the probes' documents are
    others (never prefilled); ``burst``: every probe arrives at once, after the last warm one."""
    rng = np.random.default_rng([seed, 5])
    tok = lambda n: rng.integers(1, VOCAB, size=n).tolist()  # noqa: E731
    out = []
    for k in range(p.probes):
        doc, other = tok(p.doc_len), tok(p.doc_len)
        out.append(Request(2 * k, doc + tok(p.question_len), p.output_len, 2.0 * k, "warm"))
        at = 2.0 * p.probes + 1 if burst else 2.0 * k + 1
        out.append(Request(2 * k + 1, (other if cold else doc) + tok(p.question_len),
                           p.output_len, at, "probe"))
    return out


def run_group(p: TieredRetrievalParams, group: str, seed: int,
              burst: bool = False) -> dict[str, Any]:
    env = simpy.Environment()
    spec = get_model(p.model)
    st = StepTimeModel.preset(p.model, p.gpu)
    c = costs(p)
    store = make_store(p.model, c)
    ext = group in ("cpu", "l2", "all-miss")
    conn = TierConnector(make_stack(p.model, c, store=store, owner="probe")) if ext else None
    opts = VLLMOptions(enable_prefix_caching=group == "hbm")
    kv = 40 * GiB
    probe = VLLMLikeEngine(env, "probe", static_pool(spec, kv, name="probe"), st,
                           options=opts, connector=conn)
    reqs = workload(p, seed, cold=group == "all-miss", burst=burst)
    warm = [r for r in reqs if r.group == "warm"]
    probes = [r for r in reqs if r.group == "probe"]
    if group == "l2":  # another instance prefills; it shares only the store
        wconn = TierConnector(make_stack(p.model, c, store=store, owner="warm"))
        other = VLLMLikeEngine(env, "warm", static_pool(spec, kv, name="warm"), st,
                               options=VLLMOptions(), connector=wconn)
        other.submit(warm)
        probe.submit(probes)
        env.run(until=2.0 * p.probes + 60)
    else:
        probe.submit(reqs)
        probe.advance()
    return {"group": group, "seed": seed, "probes": [_row(r, conn) for r in probes],
            "store": {"metadata_requests": store.metadata_requests,
                      "payload_read": store.payload_read,
                      "payload_written": store.payload_written},
            "save": _save_row(conn, warm)}


def _row(r: Request, conn: TierConnector | None) -> dict[str, Any]:
    ld = conn.loads.get(r.rid) if conn else None
    wait = r.first_scheduled - r.arrival
    ttft = r.first_token - r.arrival
    lookup, retrieve, h2d = (ld.lookup_s, ld.retrieve_s, ld.h2d_s) if ld else (0.0, 0.0, 0.0)
    return {"rid": r.rid, "ttft": ttft, "wait": wait, "lookup": lookup, "retrieve": retrieve,
            "h2d": h2d, "prefill": ttft - wait - lookup - retrieve - h2d,
            "local_hit": r.prefix_hit_tokens, "external_hit": ld.new_tokens if ld else 0,
            "chunks": dict(ld.chunks) if ld else {},
            "cross_instance_chunks": ld.cross_instance_chunks if ld else 0,
            "metadata_requests": ld.metadata_requests if ld else 0,
            "payload_bytes": ld.payload_bytes if ld else 0, "h2d_bytes": ld.h2d_bytes if ld else 0,
            "computed": r.prompt_len - r.prefix_hit_tokens - (ld.new_tokens if ld else 0),
            "prompt_len": r.prompt_len}


def _save_row(conn: TierConnector | None, warm: list[Request]) -> dict[str, Any]:
    if conn is None or not conn.saves:
        return {"d2h_s": 0.0, "remote_s": 0.0, "payload_bytes": 0}
    sv = list(conn.saves.values())
    return {"d2h_s": sum(s.d2h_s for s in sv), "remote_s": sum(s.remote_s for s in sv),
            "payload_bytes": sum(s.payload_bytes for s in sv), "saves": len(sv)}


def crossover(p: TieredRetrievalParams) -> list[dict[str, Any]]:
    """Store retrieval against recompute per (prompt length, chunk size, bandwidth)."""
    st = StepTimeModel.preset(p.model, p.gpu)
    rows = []
    for n in p.sweep_lens:
        full = prefill_s(st, n)
        for ch in p.sweep_chunks:
            tokens = list(range(1, n + 1))
            fixed = move = None
            for gbps in p.sweep_gbps:
                s = make_stack(p.model, costs(p, chunk_tokens=ch, remote_bw=gbps * 1e9),
                               dram=False)
                s.save(tokens)
                r = s.retrieve(tokens)
                rest = prefill_s(st, n - r.hit_tokens, r.hit_tokens)
                total = r.load_s + rest
                if r.chunks:  # split the cost: what does not scale with 1/bw, and what does
                    move = r.payload_bytes
                    fixed = total - move / (gbps * 1e9)
                rows.append({"prompt_len": n, "chunk": ch, "gbps": gbps, "hit": r.hit_tokens,
                             "recompute_ms": full * 1e3, "retrieve_ms": total * 1e3,
                             "lookup_ms": r.lookup_s * 1e3, "transfer_ms": r.retrieve_s * 1e3,
                             "h2d_ms": r.h2d_s * 1e3, "rest_prefill_ms": rest * 1e3,
                             "winner": "nothing to retrieve" if not r.hit_tokens else
                             "retrieve" if total < full else "recompute"})
            be = None if move is None or full <= fixed else move / (full - fixed) / 1e9
            for row in rows[-len(p.sweep_gbps):]:
                row["break_even_gbps"] = be
    return rows


def concurrency(p: TieredRetrievalParams, seed: int) -> list[dict[str, Any]]:
    """``c`` probes at once per group: their loads share one step (one link), so they add up."""
    rows = []
    for c in p.sweep_concurrency:
        for g in ("baseline", "cpu", "l2"):
            ps = run_group(replace(p, probes=c), g, seed, burst=True)["probes"]
            t = sorted(r["ttft"] for r in ps)
            rows.append({"concurrency": c, "group": g, "ttft_p50_ms": t[len(t) // 2] * 1e3,
                         "ttft_max_ms": t[-1] * 1e3,
                         "load_sum_ms": sum(r["lookup"] + r["retrieve"] + r["h2d"]
                                            for r in ps) * 1e3,
                         "load_each_ms": [round((r["lookup"] + r["retrieve"] + r["h2d"]) * 1e3,
                                                3) for r in ps]})
    return rows


def sweep(p: TieredRetrievalParams, progress: Progress | None = None) -> dict[str, Any]:
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    seeds = [p.seed + i for i in range(n)]
    order = [(g, s) for i, s in enumerate(seeds) for g in (GROUPS if i % 2 == 0 else
                                                          GROUPS[::-1])]
    runs: dict[str, dict[int, dict]] = {g: {} for g in GROUPS}
    for k, (g, s) in enumerate(order):
        runs[g][s] = run_group(p, g, s)
        if progress:
            progress(k + 1, len(order) + 1, f"{g} seed {s}")
    return {"seeds": seeds, "order": [f"{g}/{s}" for g, s in order], "runs": runs,
            "crossover": crossover(p), "concurrency": concurrency(p, seeds[0])}


