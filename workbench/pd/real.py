"""PD disaggregation for real: a prefill mini engine and a decode mini engine, the request's KV
copied from one pool to the other (seed 003 E7; the simulated side is :mod:`workbench.pd.cluster`).

The flow, driven from outside both engines through their schedulers' public hooks:

1. the **prefill** engine runs the request with two tokens to go; the step that computes its
   last prompt chunk samples the first token. :class:`PDPair` then takes the request out of the
   prefill scheduler's running list *without* releasing it, so its blocks stay held (pinned);
2. the request is added to the **decode** engine with the prompt and that first token, and a
   :class:`KVHandover` sits on the decode scheduler as its KV connector: at admission it says
   the whole prompt's KV can be loaded, the scheduler allocates blocks for the prompt and the
   first token in the decode engine's own (VMM-backed) pool, and ``load`` copies the prompt's
   blocks into them (:func:`~workbench.pd.kvcopy.copy_blocks`, waited on);
3. only then the prefill side releases the request, and its blocks go back to its pool;
4. the decode engine's next step is a plain decode: it writes the first token's K/V and samples
   the second token. No prompt token is computed twice.

Unlike the simulator (which hands over all prompt tokens but the last and lets the decode side
recompute it to sample the first token, as vLLM's connectors do), this handover keeps the prefill
side's first token and copies every prompt token's KV. Both engines step in one thread, one after
the other: the timings isolate the handover; they do not show two GPUs working at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.engines.sched.request import ReqState, Request
from workbench.errors import ConfigError
from workbench.mini.engine import Engine, Seq
from workbench.pd.kvcopy import CopyResult, check_compatible, copy_blocks, on_device


@dataclass(slots=True)
class HandoverTimes:
    """One request's life across the pair (``time.perf_counter`` seconds; 0 = not yet)."""

    rid: str
    prompt_len: int
    arrival: float = 0.0
    prefilled: float = 0.0  # the prefill step that sampled the first token returned
    copy_start: float = 0.0  # the decode engine admitted it; the copy began
    copy_end: float = 0.0  # the copy completed on both devices
    released: float = 0.0  # the prefill side gave the blocks back
    second_token: float = 0.0  # the decode engine's first step for it returned
    finish: float = 0.0
    copy: CopyResult | None = None

    def split_ms(self) -> dict[str, float]:
        """TTFT as the decode side (which serves the stream) holds it: prefill, decode wait
        (handed over, not yet admitted), transfer; then the decode side's own time."""
        ms = 1e3
        out = {"prefill": (self.prefilled - self.arrival) * ms,
               "decode_wait": (self.copy_start - self.prefilled) * ms if self.copy else 0.0,
               "transfer": (self.copy_end - self.copy_start) * ms if self.copy else 0.0}
        out["ttft"] = sum(out.values())
        out["first_decode_step"] = (self.second_token - self.copy_end) * ms if self.copy else 0.0
        out["decode"] = (self.finish - (self.copy_end or self.prefilled)) * ms
        return {k: round(v, 3) for k, v in out.items()}


@dataclass(slots=True)
class _Pending:
    source: Seq  # the prefill engine's request, still holding its blocks
    times: HandoverTimes


class KVHandover:
    """The decode scheduler's KV connector (``VLLMScheduler.connector``): requests handed over
    by the prefill engine load their prompt's KV by copying it; every other request gets 0."""

    def __init__(self, prefill: Engine, decode: Engine):
        check_compatible(prefill.kv, decode.kv)
        self.prefill, self.decode = prefill, decode
        self.pending: dict[int, _Pending] = {}

    def expect(self, dst: Seq, src: Seq, times: HandoverTimes) -> None:
        self.pending[id(dst)] = _Pending(src, times)

    def lookup(self, req: Request, local_tokens: int) -> int:
        p = self.pending.get(id(req))
        return 0 if p is None else max(0, p.source.prompt_len - local_tokens)

    def load(self, req: Request, local_tokens: int, tokens: int) -> None:
        """Called after the decode scheduler allocated ``req``'s blocks: copy, wait, release."""
        p = self.pending.pop(id(req), None)
        if p is None:
            return
        bs = self.decode.kv.block_size
        first, end = local_tokens // bs, -(-(local_tokens + tokens) // bs)
        p.times.copy_start = time.perf_counter()
        try:
            p.times.copy = copy_blocks(self.prefill.kv, self.decode.kv,
                                       p.source.blocks[first:end], req.blocks[first:end])
            p.times.copy_end = time.perf_counter()
        except BaseException:
            # Neither side keeps blocks for it: the request stays queued on the decode side
            # with nothing computed, so stepping on recomputes its prompt (the fallback).
            self.decode.scheduler.kvm.free(req)
            raise
        finally:
            self.release(p)

    def release(self, p: _Pending) -> None:
        """Give the prefill side's blocks back (after the copy, or when the request is gone)."""
        self.prefill.scheduler.release(p.source, finished=True)
        p.source.state = ReqState.FINISHED
        p.source.finish_reason = "handover"
        p.times.released = time.perf_counter()

    def drop(self, req: Request) -> None:
        """The decode side gave up on ``req`` before loading it: free its source."""
        p = self.pending.pop(id(req), None)
        if p is not None:
            self.release(p)


class PDPair:
    """A prefill engine and a decode engine joined by :class:`KVHandover`.

    The engines may sit on two GPUs, on one GPU or on the host; they must share the model
    config and block size. ``generate`` returns each prompt's greedy tokens (the first one
    sampled by the prefill engine) and leaves one :class:`HandoverTimes` per request in
    ``times``.
    """

    def __init__(self, prefill: Engine, decode: Engine):
        if prefill is decode:
            raise ConfigError("PDPair(prefill, decode)", "got one engine for both roles",
                              "build two engines (they may share a model and a device)")
        if decode.scheduler.connector is not None:
            raise ConfigError(f"decode engine {decode.scheduler.name!r}",
                              "already has a KV connector", "give the pair a fresh engine")
        self.prefill, self.decode = prefill, decode
        self.handover = KVHandover(prefill, decode)
        decode.scheduler.connector = self.handover
        self.times: dict[str, HandoverTimes] = {}
        self._outputs: dict[str, Seq] = {}  # rid -> the sequence whose output the user gets
        self._max_tokens: dict[int, int] = {}  # id(prefill seq) -> the user's max_tokens
        self._n = 0

    def submit(self, prompt: Sequence[int], max_tokens: int) -> str:
        """Queue a request on the prefill engine; returns its id."""
        rid = f"pd-{self._n}"
        self._n += 1
        with on_device(self.prefill.device):
            src = self.prefill.add_request(prompt, 2, rid=rid)  # 2: it stops after token one
        self._max_tokens[id(src)] = max_tokens
        self.times[rid] = HandoverTimes(rid, len(src.prompt), arrival=src.arrival)
        self._outputs[rid] = src
        return rid

    def has_work(self) -> bool:
        return self.prefill.has_work() or self.decode.has_work()

    def step(self) -> None:
        """One prefill step (then hand over what it finished), then one decode step."""
        if self.prefill.has_work():
            with on_device(self.prefill.device):
                self.prefill.step()
            self._hand_over()
        if self.decode.has_work():
            with on_device(self.decode.device):
                done = self.decode.step()
            for seq in done + self.decode.scheduler.running:
                t = self.times[seq.name]
                if not t.second_token and seq.token_times:
                    t.second_token = seq.token_times[0]
                if seq.finished:
                    t.finish = seq.finish or time.perf_counter()

    def _hand_over(self) -> None:
        sched = self.prefill.scheduler
        ready = [s for s in sched.running if s.output_len >= 1]
        for src in ready:
            sched.running.remove(src)  # out of the batch, blocks still held
            t = self.times[src.name]
            t.prefilled = time.perf_counter()
            max_tokens = self._max_tokens.pop(id(src))
            if max_tokens == 1:  # nothing left to decode: the prefill side's token is all
                t.finish = t.prefilled
                self.handover.release(_Pending(src, t))
                continue
            with on_device(self.decode.device):
                dst = self.decode.add_request(src.prompt, max_tokens, rid=src.name,
                                              arrival=src.arrival)
            dst.tokens.append(src.tokens[-1])  # the first token, sampled on the prefill side
            dst.output_len = 1
            dst.first_token = t.prefilled
            self.handover.expect(dst, src, t)
            self._outputs[src.name] = dst

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[list[int]]:
        """Greedy tokens of every prompt, all submitted at once."""
        rids = [self.submit(p, max_tokens) for p in prompts]
        idle = 0
        while self.has_work():
            self.step()
            stuck = (self.decode.scheduler.waiting and not self.decode.scheduler.running
                     and not self.prefill.has_work())
            idle = idle + 1 if stuck else 0
            if idle > 3:  # the decode pool cannot take even one request: give up, free sources
                for seq in list(self.decode.scheduler.waiting):
                    self.handover.drop(seq)
                    self.decode.abort(seq, "abort")
        return [self.output(r) for r in rids]

    def output(self, rid: str) -> list[int]:
        seq = self._outputs[rid]
        return list(seq.output[:1]) if seq.finish_reason == "handover" else list(seq.output)

    def close(self) -> None:
        """Unhook the connector and free every source still waiting for its copy (the engines
        stay open: their owner closes them)."""
        for seq in list(self.decode.scheduler.waiting):
            if id(seq) in self.handover.pending:
                self.handover.drop(seq)
                self.decode.abort(seq, "abort")
        self.decode.scheduler.connector = None
