"""Dynamic limit on a real vLLM or SGLang (seed 001 §9): ``kvctl limit`` from another process
while the engine serves; every answer (acknowledged / superseded / refused / pending) and outcome
(applied / deferred), no request lost, and the device's free memory moving by the pages the limit
freed. SGLang's allocator defers a limit while live or radix-cached tokens sit above it (a limit
never takes slots the cache owns); after the load the SGLang run sets the limit once more and
flushes the radix cache (``POST /flush_cache``), so the limit converges, and says so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from workbench.engines.real.client import Sampling
from workbench.engines.sched.request import Request
from workbench.labs.kit import server_rig as rig


def kvctl_limit(pool: str, size: int, wait: float = 20.0) -> dict[str, Any]:
    """``workbench kvctl limit`` in a process of its own, as an operator would run it."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "limit", pool, str(size),
                        "--json", "--wait", str(wait)], capture_output=True, text=True)
    try:
        a = json.loads(p.stdout)
    except json.JSONDecodeError:  # exit 2: refused by kvctl before anything was written
        return {"requested": size, "answer": "refused" if p.returncode == 2 else "error",
                "outcome": "not written", "rc": p.returncode,
                "detail": (p.stderr or p.stdout).strip()[-300:]}
    info = a.get("info") or {}
    return {"requested": size, "answer": a.get("answer"), "outcome": a.get("outcome"),
            "rc": p.returncode, "mapped_after": info.get("mapped"),
            "limit_in_force": info.get("limit"), "s": round(time.monotonic() - t0, 3)}


def _wait_mapped(eng, at_least: int, timeout_s: float, still_s: float = 3.0) -> int:
    """Until ``at_least`` bytes are mapped, or mapped bytes have not grown for ``still_s``."""
    end = time.monotonic() + timeout_s
    best, since = 0, time.monotonic()
    while time.monotonic() < end:
        m = eng.kv_pool.mapped_bytes
        if m >= at_least:
            break
        if m > best:
            best, since = m, time.monotonic()
        elif time.monotonic() - since > still_s and best > 0:
            break
        time.sleep(0.05)
    return eng.kv_pool.mapped_bytes


def _race(pool: str, a: int, b: int) -> list[dict[str, Any]]:
    """Two limits written back to back by two processes: the first may be superseded."""
    out: list[dict[str, Any]] = [{}, {}]
    t = threading.Thread(target=lambda: out.__setitem__(0, kvctl_limit(pool, a)))
    t.start()
    time.sleep(0.02)
    out[1] = kvctl_limit(pool, b)
    t.join()
    return out


def _steps(eng, page: int, free_of) -> list[dict[str, Any]]:
    pool, cap = eng.ipc_name, eng.kv_pool.capacity_bytes
    steps = []
    mapped = eng.kv_pool.mapped_bytes
    half = max(page, (mapped // 2) // page * page)
    for label, fn in (("halve", lambda: [kvctl_limit(pool, half)]),
                      ("two writers", lambda: _race(pool, half + page, half)),
                      ("below one page id", lambda: [kvctl_limit(pool, page // 2)]),
                      ("lift", lambda: [kvctl_limit(pool, cap)])):
        free0, mapped0 = free_of(), eng.kv_pool.mapped_bytes
        for a in fn():
            steps.append({"step": label, **a, "mapped_before": mapped0,
                          "free_before": free0})
        time.sleep(0.3)
        steps[-1]["free_after"] = free_of()
        steps[-1]["mapped_settled"] = eng.kv_pool.mapped_bytes
    return steps


class Feeder(threading.Thread):
    """Keeps ``n`` requests in flight until stopped, so the pool allocates and frees (and so
    polls its control segment) through every limit step."""

    def __init__(self, eng, prompts: list[list[int]], tokens: int):
        super().__init__(daemon=True)
        self.eng, self.prompts, self.tokens = eng, prompts, tokens
        self.reqs: list[Request] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = len(self.prompts)
        while not self.stop.is_set():
            live = sum(1 for r in self.reqs if r.finish is None and r.state.value != "rejected")
            for _ in range(n - live):
                i = len(self.reqs)
                r = Request(rid=i, prompt=self.prompts[i % n], max_new_tokens=self.tokens)
                self.reqs.append(r)
                self.eng.submit([r])
            self.stop.wait(0.02)


def flush_step(eng, size: int, free_of) -> dict[str, Any]:
    """SGLang, drained: ``kvctl limit size`` while the radix cache holds the load's tokens
    (deferred), and ``/flush_cache`` 0.3 s into its wait; the free the flush makes applies it."""
    free0, mapped0 = free_of(), eng.kv_pool.mapped_bytes
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(kvctl_limit(eng.ipc_name, size, wait=5.0)))
    t.start()
    time.sleep(0.3)
    flushed = eng.flush_cache()
    t.join()
    time.sleep(0.3)
    return {"step": "flush the radix cache", **out, "flush": flushed, "mapped_before": mapped0,
            "free_before": free0, "free_after": free_of(),
            "mapped_settled": eng.kv_pool.mapped_bytes, "limit_after": eng.kv_pool.limit_bytes}


def _engine(kind: str, backend: str, py: str, root, n: int, runner: str | None):
    knobs = {"min_reserved_pages": "0", "max_reserved_pages": "0"}
    return rig.engine("dl-elastic", backend, rig.model_dir(py, root, kind), py, root,
                      elastic=True, kind=kind, max_num_seqs=n, knobs=knobs, runner=runner,
                      **rig.lab_pool(kind))


def run(backend: str, quick: bool = False, kind: str = "vllm",
        runner: str | None = None) -> dict[str, Any]:
    py = rig.python_for("dynamic-limit", kind)
    root = rig.workroot()
    dev = rig.device_of(backend)
    n, tokens = (8, 96) if quick else (32, 224)
    eng = _engine(kind, backend, py, root, n, runner)
    try:
        rig.start_all([eng])
        info = eng.kv_pool.info()
        page = info.page_id_bytes
        free_idle, mapped_idle = rig.device_free(dev), info.mapped
        eng.sampling = eng._sender.sampling = Sampling()
        feed = Feeder(eng, rig.prompts(n, shared=0, tail=96, seed=1), tokens)
        feed.start()
        peak = _wait_mapped(eng, mapped_idle + 4 * page, 300)
        steps = _steps(eng, page, lambda: rig.device_free(dev))
        feed.stop.set()
        feed.join()
        eng.advance()
        if eng.flushes_cache:  # the radix cache dropped: its slots go back too
            steps.append(flush_step(eng, steps[0]["requested"], lambda: rig.device_free(dev)))
        done = [eng.outcome(r.rid) for r in feed.reqs]
        return {"backend": backend, "device": dev, "engine": kind, "runner": eng.runner,
                "requests": len(done),
                "max_tokens": tokens,
                "in_flight": n, "page_id_bytes": page, "capacity": info.capacity,
                "mapped_idle": mapped_idle, "free_idle": free_idle,
                "mapped_at_first_limit": peak, "steps": steps,
                "finished": sum(1 for o in done if not o.error and len(o.token_ids) == tokens),
                "lost": [o.error for o in done if o.error][:3],
                "mapped_end": eng.kv_pool.mapped_bytes, "free_end": rig.device_free(dev),
                "counters": rig.counters(eng),
                "timeline": [(round(s.t, 3), s.mapped_bytes) for s in eng.samples][::10],
                "summary": eng.metrics().as_dict()}
    finally:
        eng.close()
        shutil.rmtree(root, ignore_errors=True)
