"""The scheduler seam: ``Scheduler.schedule() -> StepPlan``, then ``update(plan, now)``.

No SimPy here. A driver (the SimPy one in :mod:`workbench.engines.sim.driver`, or a real GPU engine)
loops::

    plan = sched.schedule()          # which requests run this step, how many tokens each
    ... run the model on plan.items ...
    finished = sched.update(plan, now, token_ids)   # sampled tokens (None: the simulator's)

A request's KV covers ``num_computed`` tokens; a step computes ``n`` more. When a request's KV
catches up with every known token, the step samples one new token (prefill completion or decode).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from workbench.engines.sched.request import ReqState, Request


class StepPlan(NamedTuple):
    items: list[tuple[Request, int]]  # (request, tokens computed this step)
    kind: str  # "mixed" (vLLM), "extend" or "decode" (SGLang), "idle"
    preempted: list[Request]  # preempted (vLLM) or retracted (SGLang) while planning
    new_tokens: int
    ctx_tokens: int  # KV tokens read (sum of contexts before this step)
    attn_pairs: float

    @property
    def num_seqs(self) -> int:
        return len(self.items)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prompt (or recompute) chunks; the rest of ``new_tokens`` are decodes."""
        return sum(n for r, n in self.items if n > 1 or r.output_len == 0)


def make_plan(items: list[tuple[Request, int]], kind: str, preempted: list[Request]) -> StepPlan:
    new = ctx = 0
    pairs = 0.0
    for r, n in items:
        c = r.num_computed
        new += n
        ctx += c
        pairs += n * c + n * (n + 1) / 2 if n > 1 else c + 1
    return StepPlan(items, kind if items else "idle", preempted, new, ctx, pairs)


class SchedulerStats:
    __slots__ = ("preemptions", "misses", "prefix_queries", "prefix_hit_tokens",
                 "prompt_tokens", "steps", "recomputed_tokens")

    def __init__(self) -> None:
        self.preemptions = 0  # preempted (vLLM) or retracted (SGLang) requests
        self.misses = 0  # allocation attempts that got None
        self.prefix_queries = 0  # admissions that looked up the prefix cache
        self.prefix_hit_tokens = 0  # prompt tokens served from the cache at admission
        self.prompt_tokens = 0  # prompt tokens of those admissions (the hit-rate denominator)
        self.steps = 0
        self.recomputed_tokens = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class Scheduler:
    """Queues and the update step every engine shares; subclasses decide ``schedule``."""

    def __init__(self, name: str = "engine", max_num_seqs: int = 256):
        self.name = name
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.stats = SchedulerStats()

    def add_request(self, req: Request) -> None:
        req.state = ReqState.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, plan: StepPlan, now: float,
               token_ids: Sequence[int] | None = None) -> list[Request]:
        """Advance every scheduled request; returns the ones that finished."""
        done: list[Request] = []
        self.stats.steps += 1
        for i, (req, n) in enumerate(plan.items):
            req.num_computed += n
            if req.num_computed < len(req.tokens):
                continue  # a prefill chunk: no token yet
            # the simulator's stand-in for a sampled token: deterministic, request-specific
            tok = token_ids[i] if token_ids is not None else \
                (req.rid * 1_000_003 + req.output_len * 7919) % 128_000 + 1
            req.tokens.append(tok)
            req.output_len += 1
            req.token_times.append(now)
            if req.first_token is None:
                req.first_token = now
            if req.output_len >= req.max_new_tokens:
                req.finish = now
                req.state = ReqState.FINISHED
                done.append(req)
        if done:
            gone = set(map(id, done))
            self.running = [r for r in self.running if id(r) not in gone]
            for req in done:
                self.release(req, finished=True)
            self.finished.extend(done)
        return done

    def release(self, req: Request, finished: bool) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _requeue(self, req: Request) -> None:
        """Preempted/retracted: its KV is gone (recompute), it goes back to the queue head."""
        req.state = ReqState.WAITING
        req.preemptions += 1
        req.recomputed_tokens += req.num_computed
        self.stats.recomputed_tokens += req.num_computed
        self.stats.preemptions += 1
        req.num_computed = 0
        self.waiting.appendleft(req)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def attn_pairs(q: int, ctx_before: int) -> float:
    """Query-key pairs of ``q`` new tokens after ``ctx_before`` cached ones (causal)."""
    return q * ctx_before + q * (q + 1) / 2


__all__ = ["StepPlan", "Scheduler", "SchedulerStats", "make_plan", "cdiv", "attn_pairs"]
