"""Two real elastic engines under one ``WORKBENCH_KV_GPU_BUDGET``, what the pair labs share
(same-engine-pair: two vLLMs; cross-engine: a vLLM and an SGLang): one sampler reading both
control segments, the budget segment and the device's free memory every 50 ms; a load keeping
requests in flight; phases in order with ``kvctl budget`` asked mid-phase; the budget file
removed after the run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from workbench.core import budget_segment as bs
from workbench.core import control
from workbench.engines.metrics import summarize
from workbench.engines.sched.request import Request
from workbench.labs.kit import server_rig as rig


class Sampler(threading.Thread):
    """Both segments, the budget and the device's free memory in one reading every 50 ms, and
    one more as each phase begins (so every phase has a reading however busy the machine)."""

    def __init__(self, engines, device: str, budget: int):
        super().__init__(daemon=True)
        self.engines, self.device, self.budget = engines, device, budget
        self.rows: list[dict[str, Any]] = []
        self._phase = "idle"
        self._rows_lock = threading.Lock()  # rows stay in the order of their readings
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name
        self._take()

    def _take(self) -> None:
        with self._rows_lock:
            try:
                self.rows.append(self.reading())
            except Exception:  # noqa: BLE001 - a torn read: the next one counts
                pass

    def reading(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 3), "phase": self.phase}
        for e in self.engines:
            i = control.read_segment(e.ipc_name)
            row[e.name] = i.mapped if i else None
            row[f"{e.name}_used"] = i.used_blocks if i else None
        found, _ = bs.scan_budgets()
        held = [s for s in found.values() if s.total == self.budget]
        if held:
            row.update(total=held[0].total, held=held[0].held,
                       holders={str(h.pid): h.held for h in held[0].holders.values() if h.held})
        row["free"] = rig.device_free(self.device)
        return row

    def run(self) -> None:
        while not self.stop.is_set():
            self._take()
            self.stop.wait(0.05)


def kvctl_budget(*extra: str) -> dict[str, Any]:
    """``workbench kvctl budget --json`` in a process of its own, as an operator runs it."""
    p = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "budget", "--json", *extra],
                       capture_output=True, text=True, timeout=120)
    try:
        return {"rc": p.returncode, "budgets": json.loads(p.stdout)}
    except json.JSONDecodeError:
        return {"rc": p.returncode, "budgets": {}, "stderr": p.stderr.strip()[-300:]}


def busy(engines, prompts: list[list[int]], tokens: int, seconds: float,
         first_rid: int) -> list[tuple[Any, Request]]:
    """Keep ``len(prompts)`` requests in flight on each of ``engines`` for ``seconds``, then let
    them finish; every request sent, with the engine it went to."""
    sent: list[tuple[Any, Request]] = []
    end = time.monotonic() + seconds
    rid = first_rid
    while time.monotonic() < end:
        for e in engines:
            live = sum(1 for x, r in sent if x is e and r.finish is None
                       and r.state.value != "rejected")
            for _ in range(len(prompts) - live):
                r = Request(rid=rid, prompt=prompts[rid % len(prompts)], max_new_tokens=tokens)
                rid += 1
                sent.append((e, r))
                e.submit([r])
        time.sleep(0.02)
    for e in engines:
        e.advance()
    return sent


def _ttft_ms(reqs: list[Request]) -> dict[str, float]:
    """Client-side TTFT p50 / p99 of one engine's requests in one phase (ms)."""
    d = summarize(reqs).as_dict()["ttft"]
    return {"p50": round(d["p50"] * 1e3, 1), "p99": round(d["p99"] * 1e3, 1)}


class Phases:
    """The run's phases in order, what was sent in each, the mid-phase ``kvctl budget``
    answers and each busy engine's TTFT."""

    def __init__(self, sampler: Sampler, n: int, tokens: int, phase_s: float):
        self.sampler, self.n, self.tokens, self.phase_s = sampler, n, tokens, phase_s
        self.names = ["idle"]
        self.sent: list[tuple[Any, Request]] = []
        self.budgets = {"idle": kvctl_budget()}
        self.ttft: dict[str, dict[str, dict[str, float]]] = {}

    def ask(self, key: str):
        return lambda: self.budgets.__setitem__(key, kvctl_budget())

    def busy(self, name: str, engs, at=None, stretch: float = 1.0) -> None:
        """Phase ``name``: ``engs`` busy for ``stretch * phase_s``; ``at`` is (fraction of the
        phase, action) pairs, by default ``kvctl budget`` 60 % in (the busy engine at its peak)."""
        i = len(self.names)
        self.names.append(name)
        self.sampler.phase = name
        prompts = rig.prompts(self.n, shared=0, tail=160, seed=10 + i)
        seconds = self.phase_s * stretch
        timers = [threading.Timer(seconds * f, fn)
                  for f, fn in (at if at is not None else [(0.6, self.ask(name))])]
        for t in timers:
            t.start()
        got = busy(engs, prompts, self.tokens, seconds, first_rid=100000 * i)
        for t in timers:
            t.join()
        self.sent += got
        self.ttft[name] = {e.name: _ttft_ms([r for x, r in got if x is e]) for e in engs}
        self.sampler.phase = f"{name} drained"
        time.sleep(1.5)  # the drained pool's last frees unmap its pages

    def exit_first(self, a, b) -> None:
        """E (twice as long): B busy; A closed (SIGTERM, then SIGKILL after the grace) 15 % in;
        ``kvctl budget`` at 50 % (A's slot after its exit), then ``kvctl budget --gc`` at 55 %
        as an operator would, and once more at 80 %."""
        def gc() -> None:
            self.budgets["E gc"] = kvctl_budget("--gc")
            self.sampler.phase = "E after gc"

        self.busy("E", [b], stretch=2.0, at=[(0.15, a.close), (0.5, self.ask("E")),
                                            (0.55, gc), (0.8, self.ask("E late"))])


def outcomes(ph: Phases, tokens: int, names) -> dict[str, Any]:
    """What each engine of ``names`` was sent in the phases, what finished in full, the first
    few errors."""
    outs = [(e.name, e.outcome(r.rid)) for e, r in ph.sent]
    return {"requests": {e: sum(1 for x, _ in outs if x == e) for e in names},
            "finished": {e: sum(1 for x, o in outs if x == e and not o.error
                                and len(o.token_ids) == tokens) for e in names},
            "lost": [o.error for _, o in outs if o.error][:3]}


def close_all(sampler: Sampler, engines, budget: int, root) -> None:
    """Stop the sampler and the engines, drop the budget segment and the run's folder."""
    sampler.stop.set()
    for e in engines:
        e.close()
    forget_budget(budget=budget)
    shutil.rmtree(root, ignore_errors=True)


def forget_budget(budget: int, wait_s: float = 15.0) -> None:
    """Remove this run's budget file (the one of total ``budget``) once no live process holds
    bytes of it (the engines' worker processes may take a moment to go after their server)."""
    from workbench.errors import ConfigError

    end = time.monotonic() + wait_s
    while True:
        found, _ = bs.scan_budgets()
        left = [ident for ident, s in found.items() if s.total == budget]
        try:
            for ident in left:
                bs.delete_budget(ident)
            return
        except (ConfigError, OSError):
            if time.monotonic() > end:
                return
            time.sleep(0.2)
