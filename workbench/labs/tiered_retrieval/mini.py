"""The tiered-retrieval lab on a real engine (``gpu``: CUDA; ``host``: the CPU, tiny model).

The mini engine (:mod:`workbench.mini`) with VMM-backed KV serves each group's probes one at a
time, each after a warm request on the same document: *baseline* (no cache), *HBM* (the
BlockPool prefix cache on: a local hit), *CPU* (prefix cache off, the host tier of
:mod:`workbench.mini.hosttier` holds the document: real host-to-device copies) and *all miss*
(the tier on, the probes' documents never seen). *L2* has no real implementation (no remote store
on these backends): it is listed as not run, never simulated here. TTFT is split into wait,
lookup, H2D (issue + wait for the copies) and the remaining prefill; the host tier's data is
already in host memory, so its *retrieve* term (remote to host) is zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.backends import capabilities
from workbench.labs.kit.base import Progress

MINI_GROUPS = ("baseline", "hbm", "cpu", "all-miss")
L2_NOT_RUN = "not run: no remote store on this backend (modelled on sim only)"


@dataclass(slots=True)
class MiniSetup:
    model: str
    doc_len: int
    question_len: int
    output_len: int
    chunk_tokens: int
    probes: int
    seeds: list[int]
    shape: dict


def setup_for(p: Any, backend: str) -> MiniSetup:
    """The lab's sizes on a real engine: the 8B shape on a GPU, the tiny model on the CPU (a
    document that is not a whole number of chunks, so HBM's 16-token blocks hit more)."""
    n = p.repeats if p.repeats is not None else (2 if p.quick else 3)
    seeds = [p.seed + i for i in range(n)]
    if not capabilities(backend).cuda:  # the CPU: the tiny model
        return MiniSetup("tiny", 232, 16, 4, 64, 3, seeds, {})
    return MiniSetup(p.model, p.doc_len, p.question_len, p.output_len, p.chunk_tokens,
                     3 if p.quick else p.probes, seeds, {})


class _Rig:
    def __init__(self, s: MiniSetup, backend: str):
        import torch

        from workbench.mini.model import build_model, get_config

        self.torch = torch
        self.device = torch.device("cuda" if capabilities(backend).cuda else "cpu")
        self.mcfg = get_config(s.model, **s.shape)
        self.model = build_model(self.mcfg, self.device)
        self.s = s

    def engine(self, group: str):
        from workbench.mini.engine import Engine, EngineConfig
        from workbench.mini.hosttier import attach_host_tier
        from workbench.mini.kv import KVSpec

        s, kvb = self.s, self.mcfg.kv_bytes_per_token
        tokens = 2 * (s.doc_len + s.question_len + s.output_len) + 64
        spec = KVSpec(backend="vmm", kv_bytes=tokens * kvb, block_size=16)
        eng = Engine(self.mcfg, spec, self.device, EngineConfig(prefix_caching=group == "hbm"),
                     model=self.model)
        conn = None
        if group in ("cpu", "all-miss"):
            cap = (s.probes + 1) * (s.doc_len + s.question_len) * kvb
            conn = attach_host_tier(eng, capacity_bytes=cap, chunk_tokens=s.chunk_tokens)
        return eng, conn


def _probe(eng, conn, prompt: list[int], out_len: int) -> dict[str, Any]:
    seq = eng.add_request(prompt, out_len)
    start = time.perf_counter()  # the probe runs alone: its first step starts now
    while not seq.finished:
        eng.step()
    ttft = seq.first_token - seq.arrival
    wait = start - seq.arrival
    ld = conn.loads.get(seq.name) if conn is not None else None
    lookup = ld.lookup_s if ld else 0.0
    issue, hwait = (ld.copy_s, ld.wait_s) if ld else (0.0, 0.0)
    ext = ld.tokens if ld else 0
    return {"rid": seq.name, "ttft": ttft, "wait": wait, "lookup": lookup, "retrieve": 0.0,
            "h2d": issue + hwait, "h2d_issue": issue, "h2d_wait": hwait,
            "prefill": ttft - wait - lookup - issue - hwait,
            "local_hit": seq.prefix_hit_tokens, "external_hit": ext,
            "chunks": {"dram": ld.chunks} if ld and ld.chunks else {},
            "h2d_bytes": ld.nbytes if ld else 0, "blocks": ld.blocks if ld else 0,
            "computed": seq.prompt_len - seq.prefix_hit_tokens - ext,
            "prompt_len": seq.prompt_len}


def run_group(rig: _Rig, group: str, seed: int) -> dict[str, Any]:
    s = rig.s
    rng = np.random.default_rng([seed, 5])
    tok = lambda n: rng.integers(1, rig.mcfg.vocab_size, size=n).tolist()  # noqa: E731
    eng, conn = rig.engine(group)
    probes = []
    try:
        for _ in range(s.probes):
            doc, other = tok(s.doc_len), tok(s.doc_len)
            eng.generate([doc + tok(s.question_len)], s.output_len)  # the warm request
            probe = (other if group == "all-miss" else doc) + tok(s.question_len)
            probes.append(_probe(eng, conn, probe, s.output_len))
        saves = list(conn.saves.values()) if conn is not None else []
    finally:
        eng.close()
    return {"group": group, "seed": seed, "probes": probes,
            "save": {"d2h_s": sum(x.seconds for x in saves), "remote_s": 0.0,
                     "payload_bytes": 0, "saves": len(saves),
                     "d2h_bytes": sum(x.nbytes for x in saves)},
            "row_bytes": 16 * rig.mcfg.kv_bytes_per_token}


def run_mini(p: Any, backend: str, progress: Progress | None = None) -> dict[str, Any]:
    """Every group on every seed, the group order reversed on odd seeds."""
    s = setup_for(p, backend)
    rig = _Rig(s, backend)
    order = [(g, sd) for i, sd in enumerate(s.seeds)
             for g in (MINI_GROUPS if i % 2 == 0 else MINI_GROUPS[::-1])]
    runs: dict[str, dict[int, dict]] = {g: {} for g in MINI_GROUPS}
    for k, (g, sd) in enumerate(order):
        runs[g][sd] = run_group(rig, g, sd)
        if progress:
            progress(k + 1, len(order), f"{g} seed {sd}")
    device = (rig.torch.cuda.get_device_name() if rig.device.type == "cuda"
              else "cpu (host backend)")
    return {"setup": s, "seeds": s.seeds, "order": [f"{g}/{sd}" for g, sd in order],
            "runs": runs, "device": device, "kv_token_bytes": rig.mcfg.kv_bytes_per_token,
            "l2": L2_NOT_RUN}
