"""Dynamic limit (seed 000 §10, experiment 6): a memory limit set with the real
``workbench kvctl limit`` from another process while traffic runs.

The engine is a simulated vLLM-like Llama-3.1-8B whose elastic pool has a control segment. Its
clock is simulated, so this process steps the SimPy environment in chunks of ``chunk_s`` and
starts each ``kvctl limit`` subprocess *between* chunks: it waits (simulated time frozen) until
the subprocess has written its request into the segment, then steps on. The owner applies the
request on its next allocation or free and answers it; the subprocess, still waiting for that
answer, prints it. Each request is named by its id and answered acknowledged / superseded /
refused / pending (:mod:`workbench.core.limit_requests`).

The schedule (fractions of the run, limits as fractions of what is mapped at the first one):
tighten to 70 %; two requests back to back (60 %, then 50 %: the first is superseded); a remote
40 % racing an in-process 45 % for the same revision (refused: conflict); a release to the full
capacity sent with ``--wait 0`` (pending, applied after).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import simpy

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core import limit_requests
from workbench.core.control import read_segment
from workbench.core.segment import OUTCOMES
from workbench.engines.metrics import summarize
from workbench.engines.models import get_model
from workbench.engines.sched.request import ReqState
from workbench.engines.sim.kvsetup import elastic_pool
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.engines.sim.workloads import poisson
from workbench.errors import ControlError
from workbench.labs.kit.phased_sim import UnmapWatch
from workbench.units import GiB

if TYPE_CHECKING:
    from workbench.labs.dynamic_limit.params import DynamicLimitParams

MODEL, DEVICE_GIB = "llama-3.1-8b", 24.0
ANSWER_EXITS = (0, 3, 4)  # kvctl limit: acknowledged or pending, superseded, refused
WRITE_WAIT_S = 60.0  # wall seconds a kvctl subprocess may take to write its request


def kvctl_limit(name: str, nbytes: int, wait_s: float) -> subprocess.Popen:
    """The real command, in another process."""
    return subprocess.Popen([sys.executable, "-m", "workbench", "kvctl", "limit", name,
                             str(nbytes), "--json", "--wait", str(wait_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _await_written(name: str, after_rev: int, proc: subprocess.Popen) -> int:
    """Block (simulated time frozen) until the request is in the segment; its revision."""
    deadline = time.monotonic() + WRITE_WAIT_S
    while time.monotonic() < deadline:
        info = read_segment(name)
        if info is not None and info.req_revision > after_rev:
            return info.req_revision
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    _, err = proc.communicate()
    raise ControlError(f"`workbench kvctl limit {name}` wrote no request (exit "
                       f"{proc.returncode}): {err.strip()[-300:]}; run it by hand to see why")


def _answer(proc: subprocess.Popen) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    if proc.returncode not in ANSWER_EXITS:
        raise ControlError(f"`workbench kvctl limit` exited {proc.returncode}: {err.strip()}")
    return {**json.loads(out), "exit": proc.returncode}


def resolve(name: str, a: dict[str, Any]) -> str:
    """A pending request's answer now, read off the segment as the CLI would have read it."""
    info = read_segment(name)
    v = {"ack_revision": info.ack_revision, "ack_id": info.ack_id,
         "ack_outcome": OUTCOMES.index(info.ack_outcome), "revision": info.revision,
         "limit": info.limit, "outcome": OUTCOMES.index(info.outcome)}
    return limit_requests.answer(name, a["requested"], a["revision"], int(a["request_id"], 16),
                                 v, info).answer


class Run:
    """One seed: the engine, its pool with a control segment, the samples."""

    def __init__(self, p: DynamicLimitParams, seed: int):
        self.p, self.env = p, simpy.Environment()
        spec = get_model(MODEL)
        self.dev = make_device("sim", preset="h200", env=self.env, capacity=int(DEVICE_GIB * GiB),
                               name="dynamic-limit")
        self.dev.occupy("weights", spec.weight_bytes)
        self.name = f"wblab-dl-{os.getpid()}-{secrets.token_hex(3)}"
        self.ikv = elastic_pool(spec, self.dev, name="engine",
                                config=PoolConfig(ipc_name=self.name))
        self.duration = 24.0 if p.quick else 48.0
        n = int(p.rate * self.duration)
        self.reqs = poisson(p.rate, n, prompt_len=p.prompt_len, output_len=p.output_len,
                            seed=seed)
        self.eng = VLLMLikeEngine(self.env, "engine", self.ikv, StepTimeModel.preset(spec, "h200"),
                                  options=VLLMOptions(max_num_seqs=128))
        self.eng.submit(self.reqs)
        self.watch = UnmapWatch({"engine": self.eng})  # no page may leave use with live blocks
        self.kv.events.subscribe(self.watch)
        self.samples: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []

    @property
    def kv(self):
        return self.ikv.kv

    def sample(self) -> None:
        kv, s = self.kv, self.eng.scheduler
        self.samples.append({
            "t": round(self.env.now, 3), "mapped": kv.mapped_bytes, "limit": kv.limit_bytes,
            "in_use_blocks": kv.used_blocks, "revision": kv.revision,
            "shrinking": kv.pages.shrinking, "running": len(s.running),
            "waiting": len(s.waiting), "finished": len(s.finished), "misses": kv.misses,
            "preemptions": s.stats.preemptions})

    def step_to(self, t: float) -> None:
        while self.env.now < t - 1e-9:
            self.env.run(until=min(t, self.env.now + self.p.chunk_s))
            self.sample()
            self.settle()

    def settle(self) -> None:
        """Collect the answer of every waiting kvctl whose request the owner has answered, so
        each caller looks before the next request is written (its answer is then
        deterministic: a later request would otherwise supersede it while it sleeps)."""
        ack = read_segment(self.name).ack_revision
        for q in self.requests:
            if "proc" in q and ack >= q["written_revision"]:
                q.update(_answer(q.pop("proc")))

    def send(self, action: str, nbytes: int, wait_s: float) -> subprocess.Popen:
        self.settle()
        info = read_segment(self.name)
        proc = kvctl_limit(self.name, nbytes, wait_s)
        rev = _await_written(self.name, info.req_revision, proc)
        self.requests.append({"action": action, "t": self.env.now, "requested": nbytes,
                              "written_revision": rev, "proc": proc})
        return proc


def _pages(nbytes: float, page: int) -> int:
    return max(page, int(nbytes) // page * page)


def run_seed(p: DynamicLimitParams, seed: int) -> dict[str, Any]:
    r = Run(p, seed)
    page, d = r.kv.geometry.page_id_bytes, r.duration
    inproc: dict[str, Any] = {}
    try:
        r.step_to(0.2 * d)
        base = r.kv.mapped_bytes
        r.send("tighten", _pages(0.7 * base, page), 60)
        r.step_to(0.35 * d)
        r.send("race: first", _pages(0.6 * base, page), 60)
        r.send("race: second", _pages(0.5 * base, page), 60)
        r.step_to(0.5 * d)
        r.send("conflict: remote", _pages(0.4 * base, page), 60)
        res = r.kv.set_limit(_pages(0.45 * base, page))  # the owner's own, same revision
        inproc = {"t": r.env.now, **res.to_dict()}
        r.step_to(0.7 * d)
        r.send("release", r.kv.capacity_bytes, 0)
        r.step_to(d)
        r.eng.advance()  # drain: every request must finish
        r.sample()
        for q in r.requests:
            if "proc" in q:
                q.update(_answer(q.pop("proc")))
            q["resolved"] = resolve(r.name, q) if q["answer"] == "pending" else q["answer"]
    finally:
        for q in r.requests:
            if "proc" in q:
                q.pop("proc").kill()
        r.watch.shutdown.add("engine")  # closing unmaps everything: not a limit's doing
        r.kv.close()
    states = [q.state for q in r.reqs]
    return {"seed": seed, "ipc_name": r.name, "page_id_bytes": page, "base_mapped": base,
            "capacity": r.kv.capacity_bytes, "samples": r.samples, "requests": r.requests,
            "in_process_limit": inproc, "summary": summarize(r.reqs).as_dict(),
            "finished": states.count(ReqState.FINISHED), "submitted": len(states),
            "unmaps": r.watch.unmaps, "live_unmaps": r.watch.live_unmaps,
            "segment_left": read_segment(r.name) is not None}


