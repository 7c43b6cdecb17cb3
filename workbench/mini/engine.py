"""The mini engine: model + paged KV store + scheduler, one iteration per :meth:`Engine.step`.

Each step packs every scheduled token into one forward pass (decode rows first, then prefill
chunks), writes their K/V into the slots the ledger handed out, samples one token for each sequence
whose cached KV now covers all its tokens, and frees the blocks of finished sequences. Nothing here
knows whether the bytes under the KV views are VMM pages or a plain allocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from workbench.errors import ConfigError
from workbench.mini.attention import AttnContext, PrefillSeg, softmax_scale
from workbench.mini.kv import KVSpec, KVStore
from workbench.mini.model import ModelConfig, build_model
from workbench.mini.sched import Scheduled, Scheduler, SchedulerConfig, Seq


@dataclass
class EngineConfig:
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    attn_impl: str = "auto"  # "triton" (CUDA), "torch", or "auto"


@dataclass
class StepStats:
    num_decode: int = 0
    num_prefill_tokens: int = 0
    context_tokens: int = 0
    seconds: float = 0.0
    preempted: int = 0


@dataclass
class EngineStats:
    steps: list[StepStats] = field(default_factory=list)
    keep: int = 100_000  # cap memory on long servers

    def add(self, s: StepStats) -> None:
        if len(self.steps) < self.keep:
            self.steps.append(s)


class Engine:
    def __init__(self, model_cfg: ModelConfig, kv_spec: KVSpec,
                 device: str | torch.device = "cpu", cfg: EngineConfig | None = None, *,
                 model: torch.nn.Module | None = None, pool_device=None, name: str = "mini",
                 sync: bool = True):
        self.model_cfg = model_cfg
        self.cfg = cfg or EngineConfig()
        self.device = torch.device(device)
        self.model = model if model is not None else build_model(model_cfg, self.device)
        self.kv = KVStore(model_cfg, kv_spec, self.device, pool_device=pool_device, name=name)
        self.scheduler = Scheduler(self.kv.manager, self.kv.block_size,
                                   SchedulerConfig(self.cfg.max_num_seqs,
                                                   self.cfg.max_batched_tokens))
        self.scale = softmax_scale(model_cfg.head_dim)
        self.stats = EngineStats()
        self.sync = sync  # time steps with a device sync (True) or let them queue
        self._next_id = 0

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
                    seed: int | None = None, stop_ids: Sequence[int] = (),
                    rid: str | None = None,
                    on_token: Callable[[Seq, int | None], None] | None = None) -> Seq:
        cfg = self.model_cfg
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ConfigError("prompt", "is empty", "send at least one token")
        if any(not 0 <= t < cfg.vocab_size for t in prompt):
            raise ConfigError("prompt token ids", f"outside 0..{cfg.vocab_size - 1}",
                              "send ids of this model's vocabulary")
        if max_tokens < 1:
            raise ConfigError(f"max_tokens={max_tokens}", "must be at least 1", "ask for 1+")
        total = len(prompt) + max_tokens
        if total > cfg.max_position:
            raise ConfigError(f"prompt + max_tokens = {total}",
                              f"exceeds the model's {cfg.max_position} positions",
                              "shorten the prompt or lower max_tokens")
        g = self.kv.geometry
        if -(-total // g.block_size) > g.num_blocks - 1:
            raise ConfigError(f"prompt + max_tokens = {total} tokens",
                              f"exceeds the KV pool ({(g.num_blocks - 1) * g.block_size} tokens)",
                              "give the pool more memory or send a shorter request")
        if rid is None:
            rid = f"cmpl-{self._next_id}"
            self._next_id += 1
        seq = Seq(rid, prompt, max_tokens, temperature=temperature, seed=seed,
                  stop_ids=tuple(stop_ids), arrival=time.perf_counter(), on_token=on_token)
        if temperature > 0:
            seq.generator = torch.Generator(device=self.device)
            seq.generator.manual_seed(seed if seed is not None else hash(rid) & 0xFFFF_FFFF)
        self.scheduler.add(seq)
        return seq

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def abort(self, seq: Seq, reason: str = "abort") -> None:
        if seq.finished:
            return
        seq.finish_reason = reason
        if seq in self.scheduler.waiting:
            self.scheduler.waiting.remove(seq)
        self.scheduler.finish(seq)
        if seq.on_token is not None:
            seq.on_token(seq, None)

    # -- one iteration ---------------------------------------------------------------------------
    def step(self) -> list[Seq]:
        """Run one iteration; returns the sequences that finished in it."""
        before = self.scheduler.num_preemptions
        plan = self.scheduler.schedule()
        if not plan:
            return []
        t0 = time.perf_counter()
        plan.sort(key=lambda s: s.num_new != 1 or s.seq.num_computed == 0)  # decodes first
        ids, pos, slots, ctx, sample_rows = self._prepare(plan)
        logits = self.model(ids, pos, ctx, sample_rows)
        finished = self._sample(plan, logits)
        if self.sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        st = StepStats(num_decode=ctx.num_decode,
                       num_prefill_tokens=sum(p.q_len for p in ctx.prefills),
                       context_tokens=sum(s.seq.num_computed for s in plan),
                       seconds=time.perf_counter() - t0,
                       preempted=self.scheduler.num_preemptions - before)
        self.stats.add(st)
        return finished

    def _slot(self, seq: Seq, p: int) -> int:
        bs = self.kv.block_size
        return seq.blocks[p // bs] * bs + p % bs

    def _table_row(self, seq: Seq, length: int) -> list[int]:
        """vLLM: block ids; SGLang: one slot per position (``req_to_token``)."""
        if self.kv.entry_tokens == 1:
            return [self._slot(seq, p) for p in range(length)]
        return seq.blocks[: -(-length // self.kv.block_size)]

    def _prepare(self, plan: list[Scheduled]):
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        wslots: list[int] = []
        decode_rows: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSeg] = []
        sample_rows: list[int] = []
        for s in plan:
            seq, n, c = s.seq, s.num_new, s.seq.num_computed
            row = len(ids)
            ids.extend(seq.tokens[c:c + n])
            pos.extend(range(c, c + n))
            wslots.extend(self._slot(seq, p) for p in range(c, c + n))
            if n == 1 and c > 0:
                decode_rows.append(self._table_row(seq, c + 1))
                decode_lens.append(c + 1)
            else:
                slots = torch.tensor([self._slot(seq, p) for p in range(c + n)], device=dev)
                prefills.append(PrefillSeg(row, n, c + n, slots))
            if c + n == seq.num_tokens:
                sample_rows.append(row + n - 1)
        table = lens = None
        if decode_rows:
            width = max(len(r) for r in decode_rows)
            table = torch.tensor([r + [0] * (width - len(r)) for r in decode_rows],
                                 dtype=torch.int32, device=dev)
            lens = torch.tensor(decode_lens, dtype=torch.int32, device=dev)
        ctx = AttnContext(self.kv.k, self.kv.v, torch.tensor(wslots, device=dev),
                          len(decode_rows), table, lens, self.kv.entry_tokens, prefills,
                          self.scale, self.cfg.attn_impl)
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), wslots, ctx,
                torch.tensor(sample_rows, device=dev, dtype=torch.long))

    def _sample(self, plan: list[Scheduled], logits: torch.Tensor) -> list[Seq]:
        greedy = logits.argmax(-1).tolist()
        now = time.perf_counter()
        finished: list[Seq] = []
        i = 0
        for s in plan:
            seq = s.seq
            seq.num_computed += s.num_new
            if seq.num_computed != seq.num_tokens:
                continue  # a prefill chunk with more to come
            tok = greedy[i]
            if seq.temperature > 0:
                probs = torch.softmax(logits[i] / seq.temperature, -1)
                tok = int(torch.multinomial(probs, 1, generator=seq.generator))
            i += 1
            seq.tokens.append(tok)
            seq.output.append(tok)
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = now
            if tok in seq.stop_ids:
                seq.finish_reason = "stop"
            elif len(seq.output) >= seq.max_tokens:
                seq.finish_reason = "length"
            if seq.on_token is not None:
                seq.on_token(seq, tok)
            if seq.finished:
                self.scheduler.finish(seq)
                finished.append(seq)
                if seq.on_token is not None:
                    seq.on_token(seq, None)
        return finished

    # -- offline use -----------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, **kw) -> list[list[int]]:
        seqs = [self.add_request(p, max_tokens, **kw) for p in prompts]
        idle = 0
        while self.has_work():
            self.step()
            if self.scheduler.running or not self.scheduler.waiting:
                idle = 0
                continue
            idle += 1
            if idle > 3:  # nothing fits even an empty pool: give up rather than spin
                for seq in list(self.scheduler.waiting):
                    self.abort(seq, "abort")
        return [s.output for s in seqs]

    def close(self) -> None:
        self.kv.close()
