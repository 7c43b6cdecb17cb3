"""Continuous batching for the mini engine: vLLM's rules in a few lines (seed 001 §5).

Written here because ``workbench/engines/scheduler.py`` (the simulated engines' shared rules) had
not landed when this engine was built; the rules are the same, so the two can be swapped:

* one token budget per step (``max_batched_tokens``) and at most ``max_num_seqs`` running;
* running sequences first, in admission order: a decode takes 1 token, an unfinished prefill a
  chunk of what is left (chunked prefill), both capped by the budget left;
* blocks are allocated before a sequence is scheduled; on a miss (``alloc`` -> ``None``) the most
  recently admitted running sequence is preempted by **recompute** (its blocks freed, its computed
  tokens forgotten, back to the head of the waiting queue) until the alloc succeeds or the
  sequence itself is the victim;
* waiting sequences are admitted FIFO only in a step with no preemption, each with a chunk of its
  prompt; an admission miss stops admission (never a partial alloc, never a crash).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol


class Ledger(Protocol):
    def alloc(self, n: int) -> list[int] | None: ...
    def free(self, ids: list[int]) -> None: ...


@dataclass(eq=False)
class Seq:
    """One request's live state. ``tokens`` = prompt + generated; KV of ``tokens[:num_computed]``
    is in the cache, in ``blocks`` (ledger block ids; SGLang pages in the token style)."""

    rid: str
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    arrival: float = 0.0
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    preemptions: int = 0
    finish_reason: str | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    on_token: object = None  # callable(seq, token_id | None) from the engine thread
    generator: object = None  # torch.Generator for seeded sampling

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Scheduled:
    seq: Seq
    num_new: int


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048


class Scheduler:
    def __init__(self, ledger: Ledger, block_size: int, cfg: SchedulerConfig | None = None):
        self.ledger = ledger
        self.block_size = block_size
        self.cfg = cfg or SchedulerConfig()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.num_preemptions = 0

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_needed(self, seq: Seq, upto: int) -> int:
        return max(0, -(-upto // self.block_size) - len(seq.blocks))

    def _grow(self, seq: Seq, upto: int) -> bool:
        need = self._blocks_needed(seq, upto)
        if not need:
            return True
        ids = self.ledger.alloc(need)
        if ids is None:
            return False
        seq.blocks.extend(ids)
        return True

    def preempt(self, seq: Seq) -> None:
        """Recompute preemption: drop the KV, keep the tokens, requeue at the head."""
        self.running.remove(seq)
        self.release(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def release(self, seq: Seq) -> None:
        if seq.blocks:
            self.ledger.free(seq.blocks)
            seq.blocks = []

    def finish(self, seq: Seq) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self.release(seq)

    def schedule(self) -> list[Scheduled]:
        budget = self.cfg.max_batched_tokens
        plan: list[Scheduled] = []
        preempted = False
        for seq in list(self.running):
            if seq not in self.running or budget == 0:
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self._grow(seq, seq.num_computed + n):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                plan = [s for s in plan if s.seq is not victim]
                if victim is seq:
                    break
            else:
                plan.append(Scheduled(seq, n))
                budget -= n
        budget = self.cfg.max_batched_tokens - sum(s.num_new for s in plan)
        while (self.waiting and not preempted and budget > 0
               and len(self.running) < self.cfg.max_num_seqs):
            seq = self.waiting[0]
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self._grow(seq, seq.num_computed + n):
                break
            self.waiting.popleft()
            self.running.append(seq)
            plan.append(Scheduled(seq, n))
            budget -= n
        return plan
