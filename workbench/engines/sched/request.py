"""The request record shared by schedulers, drivers and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class ReqState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: float = 0.0
    group: str = ""  # workload label (prefix group A-D, "long", "short", model name...)
    # -- live state ------------------------------------------------------------------------
    state: ReqState = ReqState.WAITING
    tokens: list[int] = field(default_factory=list)  # prompt + generated so far
    num_computed: int = 0  # tokens whose KV is in the cache (prefix hits included)
    output_len: int = 0
    blocks: list[int] = field(default_factory=list)  # vLLM: block table; SGLang: KV page ids
    block_hashes: list[int] = field(default_factory=list)  # vLLM hash chain of full blocks
    num_cached_blocks: int = 0  # leading blocks already registered in the prefix cache
    node: object = None  # SGLang: the radix node this request holds a lock on
    # -- observations ----------------------------------------------------------------------
    first_scheduled: float | None = None
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    prefix_hit_tokens: int = 0  # hit length at first admission
    recomputed_tokens: int = 0  # tokens prefilled again after preemption

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def done(self) -> bool:
        return self.output_len >= self.max_new_tokens
