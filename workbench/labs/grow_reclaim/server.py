"""Grow and reclaim on a real vLLM or SGLang (seed 000 §6): one elastic engine (the tiny model,
prompts by token id) serves idle -> short -> long -> idle -> short -> idle; a sampler reads the
pool's control segment (mapped, in-use and reserved bytes, held blocks) and the device's free memory
all along, so the record shows per phase what was mapped, what was used and what the device
had left.

Prefix caching is off (the simulated baseline's setting; SGLang: ``--disable-radix-cache``): a
finished request's blocks are
freed at once, so idle memory is the null block's page plus the reserve. The reserve is kept
small (:data:`RESERVE`) so that the load's pages exceed it and unmaps show.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any

from workbench.engines.sched.request import Request
from workbench.labs.kit import server_rig as rig

RESERVE = (1, 2)  # min_reserved_pages, max_reserved_pages of the real run (prealloc on)
# (phase, requests, prompt tokens, output tokens); idle phases send nothing
PHASES = (("idle-0", 0, 0, 0), ("short", 16, 96, 32), ("long", 16, 352, 96),
          ("idle-1", 0, 0, 0), ("short-again", 16, 96, 32), ("idle-2", 0, 0, 0))


def phases(quick: bool) -> list[tuple[str, int, int, int]]:
    """The seed's order; the full run doubles each wave (twice the engine's concurrency)."""
    k = 1 if quick else 2
    return [(name, n * k, plen, out) for name, n, plen, out in PHASES]


class Sampler(threading.Thread):
    """The pool's segment and the device's free memory every ``every_s``, each row labelled
    with the phase running then."""

    def __init__(self, ipc_name: str, device: str, clock, every_s: float = 0.05):
        super().__init__(daemon=True)
        self.ipc, self.device, self.clock, self.every_s = ipc_name, device, clock, every_s
        self.phase = "start"
        self.rows: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def read(self) -> dict[str, Any] | None:
        from workbench.core import control

        i = control.read_segment(self.ipc)
        if i is None:
            return None
        return {"t": round(self.clock(), 3), "phase": self.phase, "mapped": i.mapped,
                "used": i.used, "reserved": i.reserved, "used_blocks": i.used_blocks,
                "free": rig.device_free(self.device)}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                row = self.read()
            except Exception:  # noqa: BLE001 - a torn read or a closing segment: skip one
                row = None
            if row is not None:
                self.rows.append(row)
            self.stop.wait(self.every_s)


def _wave(eng, batch: list[list[int]], tokens: int, first_rid: int) -> list[dict[str, Any]]:
    reqs = [Request(rid=first_rid + i, prompt=p, max_new_tokens=tokens)
            for i, p in enumerate(batch)]
    eng.submit(reqs)
    eng.advance()
    return [{"rid": r.rid, "tokens": len(eng.outcome(r.rid).token_ids),
             "error": eng.outcome(r.rid).error} for r in reqs]


def _serve(eng, sampler: Sampler, plan, idle_s: float) -> list[dict[str, Any]]:
    """Every phase through the engine; one row per phase (its requests and its end state)."""
    out, rid = [], 0
    for i, (name, n, plen, tokens) in enumerate(plan):
        sampler.phase = name
        t0 = eng.clock()
        done: list[dict[str, Any]] = []
        if n:
            batch = rig.prompts(n, shared=0, tail=plen - 2 * (n - 1), seed=10 + i)
            done = _wave(eng, batch, tokens, rid)
            rid += n
        time.sleep(idle_s if not n else 0.3)  # idle: let the reserve settle; load: one look
        end = sampler.read()
        out.append({"phase": name, "requests": n, "prompt_tokens": plen, "output_tokens": tokens,
                    "start_s": round(t0, 3), "end_s": round(eng.clock(), 3),
                    "finished": sum(1 for d in done if not d["error"] and d["tokens"] == tokens),
                    "lost": [d["error"] or f"{d['tokens']} tokens" for d in done
                             if d["error"] or d["tokens"] != tokens][:3], "end": end})
    return out


def run(backend: str, quick: bool = False, kind: str = "vllm",
        runner: str | None = None) -> dict[str, Any]:
    py = rig.python_for("grow-reclaim", kind)
    root = rig.workroot()
    dev = rig.device_of(backend)
    lo, hi = RESERVE
    eng = rig.engine("gr-elastic", backend, rig.model_dir(py, root, kind), py, root,
                     elastic=True, kind=kind, max_num_seqs=16, prefix_caching=False,
                     knobs={"min_reserved_pages": str(lo), "max_reserved_pages": str(hi)},
                     runner=runner, **rig.lab_pool(kind))
    sampler = None
    try:
        rig.start_all([eng])
        info = eng.kv_pool.info()
        sampler = Sampler(eng.ipc_name, dev, eng.clock)
        sampler.start()
        rows = _serve(eng, sampler, phases(quick), idle_s=2.0 if quick else 4.0)
        sampler.stop.set()
        sampler.join(5.0)
        size, bpp = rig.blocks_per_page(eng, info.page_id_bytes)
        return {"backend": backend, "device": dev, "engine": kind, "runner": eng.runner,
                "page_id_bytes": info.page_id_bytes,
                "block_size": size, "capacity": info.capacity,
                "min_reserved_pages": lo, "max_reserved_pages": hi, "prefix_caching": False,
                "blocks_per_page": bpp, "phases": rows,
                "samples": sampler.rows, "counters": rig.counters(eng),
                "summary": eng.metrics().as_dict()}
    finally:
        if sampler is not None:
            sampler.stop.set()
        eng.close()
        shutil.rmtree(root, ignore_errors=True)
