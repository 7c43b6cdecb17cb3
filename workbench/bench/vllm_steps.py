"""The cost of a scheduler step in vLLM's block pool under a memory limit, against the pool's
virtual capacity: the elastic pool over a simulated device, driven the way vLLM's scheduler
drives its BlockPool (a can-allocate check before every allocation, one new block per running
request per step, preemption of the newest request when the check fails, admission while the
check passes).

Two measures per capacity, on the same steps: Python lines executed per step (counted with a
trace function: deterministic, the same on any machine) and microseconds per step (untraced).
A cost that follows the blocks a step touches gives the same line count at every capacity.

    python -m workbench.bench.vllm_limit --steps            (in a venv with vLLM)

Needs ``vllm.v1.core.block_pool`` importable (the real one, or a stand-in a test installs).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import GiB, KiB, MiB

PAGE = 2 * MiB
BLOCK_BYTES = 128 * KiB  # the H200 run's block: 512 blocks = 64 MiB


@dataclass(slots=True)
class _Req:
    rid: int
    blocks: list = field(default_factory=list)
    left: int = 0


@dataclass(slots=True)
class Scheduler:
    """A scheduler loop over a BlockPool's public calls, as vLLM's scheduler makes them."""

    pool: object
    batch: int = 64
    prompt_blocks: int = 4
    decode_blocks: int = 8
    running: list = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    finished: int = 0
    preempted: int = 0
    _next: int = 0

    def _arrive(self) -> None:
        while len(self.waiting) < self.batch:
            self.waiting.append(_Req(self._next))
            self._next += 1

    def _free(self, req: _Req) -> None:
        self.pool.free_blocks(reversed(req.blocks))  # vLLM frees tail blocks first
        req.blocks = []

    def step(self) -> None:
        pool, running = self.pool, self.running
        pool.get_usage()  # the scheduler's stats read it every step
        i = 0
        while i < len(running):
            req = running[i]
            if pool.get_num_free_blocks() >= 1:
                req.blocks += pool.get_new_blocks(1)
                req.left -= 1
                if req.left == 0:
                    self._free(running.pop(i))
                    self.finished += 1
                    continue
                i += 1
            else:  # preempt the newest running request, which waits at the front
                victim = running.pop()
                self._free(victim)
                self.waiting.appendleft(victim)
                self.preempted += 1
        self._arrive()
        while (self.waiting and len(running) < self.batch
               and pool.get_num_free_blocks() >= self.prompt_blocks):
            req = self.waiting.popleft()
            req.blocks, req.left = pool.get_new_blocks(self.prompt_blocks), self.decode_blocks
            running.append(req)


def count_lines(fn) -> int:
    """Python lines executed by ``fn()`` (every frame it runs; C code counts nothing)."""
    n = 0

    def tracer(frame, event, arg):
        nonlocal n
        if event == "line":
            n += 1
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(old)
    return n


def elastic_pool(num_blocks: int, limit_bytes: int | None, *, min_reserved: int = 1,
                 max_reserved: int = 2, caching: bool = True):
    """An ``ElasticBlockPool`` of ``num_blocks`` 128 KiB blocks (16 per 2 MiB page) over a
    simulated device with the ledger's limit at ``limit_bytes`` (as ``kvctl limit`` sets it)."""
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.adapters.vllm.pool import ElasticBlockPool
    from workbench.backends import make_device

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=BLOCK_BYTES, block_size=1,
                     num_blocks=num_blocks, num_buffers=1, dtype_bytes=1, page_size=PAGE,
                     layout=Layout.CONTIGUOUS)
    cfg = PoolConfig(min_reserved_pages=min_reserved, max_reserved_pages=max_reserved)
    dev = make_device("sim", name="vllm-steps", capacity=geo.num_pages * PAGE + 64 * MiB)
    kv = BlockLedger(geo, dev, name=f"steps-{num_blocks}", config=cfg)
    if limit_bytes is not None:
        kv.set_limit(limit_bytes)
    registry.register(num_blocks, kv)
    try:
        return ElasticBlockPool(num_blocks, caching, 16)
    finally:
        registry.ledgers.remove((num_blocks, kv))


def sweep(capacities: list[int], limit_bytes: int | None, *, warm: int = 40, steps: int = 40,
          batch: int = 64) -> list[dict]:
    """Per capacity (bytes of virtual KV): lines and microseconds per step, after ``warm``
    steps into the steady state (the limit full, requests preempted and readmitted)."""
    rows = []
    for cap in capacities:
        pool = elastic_pool(cap // BLOCK_BYTES, limit_bytes)
        sch = Scheduler(pool, batch=batch)
        gc.collect()
        gc.freeze()  # as vLLM's engine core does after start-up: the blocks are not rescanned
        for _ in range(warm):
            sch.step()
        lines = [count_lines(sch.step) for _ in range(steps)]
        us = []
        for _ in range(steps):
            t0 = time.perf_counter()
            sch.step()
            us.append((time.perf_counter() - t0) * 1e6)
        pool.backing.check_invariants()
        rows.append({"capacity_bytes": cap, "blocks": cap // BLOCK_BYTES,
                     "limit_bytes": limit_bytes, "lines_per_step": statistics.median(lines),
                     "lines_min": min(lines), "lines_max": max(lines),
                     "us_per_step": round(statistics.median(us), 1),
                     "us_min": round(min(us), 1), "us_max": round(max(us), 1),
                     "mapped_bytes": pool.backing.mapped_bytes, "finished": sch.finished,
                     "preempted": sch.preempted, "shortfalls": pool.shortfalls})
        pool.backing.close()
        del pool, sch
        gc.unfreeze()
    return rows


def table(rows: list[dict]) -> str:
    out = ["| capacity | blocks | lines/step (min-max) | us/step median (min-max) | mapped MiB"
           " | preempted |", "|---|---|---|---|---|---|"]
    for r in rows:
        cap = r["capacity_bytes"]
        size = f"{cap / GiB:.3g} GiB" if cap >= GiB else f"{cap // MiB} MiB"
        out.append(f"| {size} | {r['blocks']} | {r['lines_per_step']:.0f} ({r['lines_min']}-"
                   f"{r['lines_max']}) | {r['us_per_step']} ({r['us_min']}-{r['us_max']}) | "
                   f"{r['mapped_bytes'] // MiB} | {r['preempted']} |")
    return "\n".join(out)
