"""The mini engine: model + paged KV store + scheduler, one iteration per :meth:`Engine.step`.

Scheduling is the simulated vLLM-like engine's own code (``workbench.engines.sched.vllm_sched``: one
token budget, chunked prefill, recompute preemption on an allocation miss, over a ``BlockPool`` on
the ledger), so the real engine and the simulator make the same decisions. Each step packs every
scheduled token into one forward pass (decode rows first, then prefill chunks), writes their K/V
into the slots the ledger handed out, samples one token for each sequence whose cached KV now
covers all its tokens, and hands the tokens to the scheduler's ``update``. Nothing here knows
whether the bytes under the KV views are VMM pages or a plain allocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from workbench.engines.sched.block_pool import BlockPool
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sched.scheduler import StepPlan
from workbench.engines.sched.vllm_sched import VLLMKVManager, VLLMScheduler
from workbench.errors import ConfigError
from workbench.mini.attention import AttnContext, PrefillSeg, softmax_scale
from workbench.mini.graphs import graphs_for
from workbench.mini.kv import KVSpec, KVStore
from workbench.mini.model import ModelConfig, build_model
from workbench.mini.req_to_token import ReqToToken


@dataclass(slots=True, eq=False)
class Seq(Request):
    """The scheduler's request record plus what a real engine needs: sampling, streaming."""

    name: str = ""
    temperature: float = 0.0
    stop_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    on_token: Callable | None = None  # on_token(seq, token_id | None) from the engine thread
    generator: torch.Generator | None = None

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineConfig:
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    attn_impl: str = "auto"  # "triton" (CUDA), "torch", or "auto"
    prefix_caching: bool = False  # vLLM's prefix cache (BlockPool); off as in the colocation bench
    cuda_graphs: bool | None = None  # decode CUDA graphs (mini.graphs); None: on where CUDA+Triton
    graph_sizes: tuple[int, ...] = ()  # batch sizes captured (padded up to); () = 1,2,4,8,16,32..


@dataclass
class StepStats:
    """One step, in the step-time model's terms (``workbench.engines.sim.steptime``)."""

    num_decode: int = 0
    num_prefill_tokens: int = 0
    context_tokens: int = 0  # KV tokens read: sum of contexts before the step
    seconds: float = 0.0  # wall time: host prep + kernels (synchronised) + sampling
    preempted: int = 0
    num_seqs: int = 0
    new_tokens: int = 0
    attn_pairs: float = 0.0
    forward_seconds: float = 0.0  # the forward alone (CUDA events; 0 off CUDA or unsynced)
    graphed: bool = False  # replayed a captured decode graph
    prefills: tuple[tuple[int, int], ...] = ()  # (q_len, ctx_len) of each prefill chunk

    def row(self) -> list:
        return [self.num_seqs, self.new_tokens, self.context_tokens, self.attn_pairs,
                self.seconds, self.num_decode, self.num_prefill_tokens]


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
        self.pool = BlockPool(self.kv.manager, enable_caching=self.cfg.prefix_caching)
        self.scheduler = VLLMScheduler(VLLMKVManager(self.pool), name=name,
                                       max_num_seqs=self.cfg.max_num_seqs,
                                       max_num_batched_tokens=self.cfg.max_batched_tokens)
        self.scale = softmax_scale(model_cfg.head_dim)
        self.stats = EngineStats()
        self.sync = sync  # time steps with a device sync (True) or let them queue
        self.connector = None  # a KV tier (workbench.mini.hosttier): saves after each forward
        # persistent device tables, written per new entry: SGLang's req_to_token (token style,
        # one slot a position) or vLLM's block table (block style, one block id a block)
        self.r2t = ReqToToken(self.cfg.max_num_seqs, model_cfg.max_position, self.device,
                              entry_tokens=self.kv.entry_tokens)
        self._entry = self._slot if self.kv.entry_tokens == 1 else self._block
        self.graphs = graphs_for(self.cfg.cuda_graphs, self.cfg.graph_sizes,
                                 self.cfg.max_num_seqs, self.model, self.kv, scale=self.scale,
                                 impl=self.cfg.attn_impl, r2t=self.r2t)
        self._next_id = 0

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, prompt: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
                    seed: int | None = None, stop_ids: Sequence[int] = (),
                    rid: str | None = None, arrival: float | None = None,
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
        num = self._next_id
        self._next_id += 1
        seq = Seq(num, prompt, max_tokens, arrival=time.perf_counter() if arrival is None
                  else arrival, name=rid or f"cmpl-{num}", temperature=temperature,
                  stop_ids=tuple(stop_ids), on_token=on_token)
        if temperature > 0:
            seq.generator = torch.Generator(device=self.device)
            seq.generator.manual_seed(seed if seed is not None else num)
        self.scheduler.add_request(seq)
        return seq

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.stats.preemptions

    def _finish(self, seq: Seq, reason: str) -> None:
        """End ``seq`` outside the scheduler's own rule (a stop token, an abort)."""
        sched = self.scheduler
        if seq in sched.waiting:
            sched.waiting.remove(seq)
        if seq in sched.running:
            sched.running.remove(seq)
            sched.release(seq, finished=True)
        seq.state = ReqState.FINISHED
        seq.finish_reason = reason
        seq.finish = time.perf_counter()

    def abort(self, seq: Seq, reason: str = "abort") -> None:
        if seq.finished:
            return
        self._finish(seq, reason)
        if seq.on_token is not None:
            seq.on_token(seq, None)

    # -- one iteration ---------------------------------------------------------------------------
    def step(self) -> list[Seq]:
        """Run one iteration; returns the sequences that finished in it."""
        t0 = time.perf_counter()
        before = self.num_preemptions
        plan = self.scheduler.schedule()
        if not plan.items:
            return []
        # decodes first (one row each, the paged kernel), then prefill chunks (SDPA)
        order = sorted(range(len(plan.items)), key=lambda i: not self._is_decode(*plan.items[i]))
        items = [plan.items[i] for i in order]
        rows = self.r2t.update(items, self._entry)
        timed = self.sync and self.device.type == "cuda"
        if timed:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        graphed = self.graphs is not None and self.graphs.fits(items, self._is_decode)
        if graphed:
            logits = self.graphs.run(items, self._slot, rows)
            num_decode, num_prefill, prefills = len(items), 0, ()
        else:
            ids, pos, ctx, sample_rows = self._prepare(items, rows)
            logits = self.model(ids, pos, ctx, sample_rows)
            num_decode, num_prefill = ctx.num_decode, sum(p.q_len for p in ctx.prefills)
            prefills = tuple((p.q_len, p.ctx_len) for p in ctx.prefills)
        if timed:
            ev[1].record()
        if self.connector is not None:  # before _sample: the scheduler frees finished blocks
            self.connector.after_forward(plan.items)
        finished = self._sample(plan, order, logits)
        if timed:
            torch.cuda.synchronize(self.device)
        st = StepStats(num_decode=num_decode, num_prefill_tokens=num_prefill,
                       context_tokens=plan.ctx_tokens, seconds=time.perf_counter() - t0,
                       forward_seconds=ev[0].elapsed_time(ev[1]) / 1e3 if timed else 0.0,
                       graphed=graphed, prefills=prefills,
                       preempted=self.num_preemptions - before, num_seqs=len(plan.items),
                       new_tokens=plan.new_tokens, attn_pairs=plan.attn_pairs)
        self.stats.add(st)
        return finished

    @staticmethod
    def _is_decode(seq: Seq, n: int) -> bool:
        return n == 1 and seq.num_computed > 0

    def _slot(self, seq: Seq, p: int) -> int:
        bs = self.kv.block_size
        return seq.blocks[p // bs] * bs + p % bs

    @staticmethod
    def _block(seq: Seq, i: int) -> int:
        return seq.blocks[i]

    def _prepare(self, items: list[tuple[Seq, int]], rows: list[int]):
        """Eager inputs; every table entry is read from the device table (``rows``: each
        item's row of it, already written for this step)."""
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        wslots: list[int] = []
        decode_rows: list[int] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSeg] = []
        sample_rows: list[int] = []
        for k, (seq, n) in enumerate(items):
            c = seq.num_computed
            row = len(ids)
            ids.extend(seq.tokens[c:c + n])
            pos.extend(range(c, c + n))
            wslots.extend(self._slot(seq, p) for p in range(c, c + n))
            if self._is_decode(seq, n):
                decode_rows.append(rows[k])
                decode_lens.append(c + 1)
            else:
                prefills.append(PrefillSeg(row, n, c + n, self.r2t.slots(rows[k], c + n)))
            if c + n == seq.num_tokens:
                sample_rows.append(row + n - 1)
        table = lens = trows = None
        if decode_rows:  # the kernel reads each sequence's row of the device table
            table = self.r2t.table
            trows = torch.tensor(decode_rows, device=dev)
            lens = torch.tensor(decode_lens, dtype=torch.int32, device=dev)
        ctx = AttnContext(self.kv.k, self.kv.v, torch.tensor(wslots, device=dev),
                          len(decode_rows), table, lens, self.kv.entry_tokens, prefills,
                          self.scale, self.cfg.attn_impl, rows=trows)
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), ctx,
                torch.tensor(sample_rows, device=dev, dtype=torch.long))

    def _sample(self, plan: StepPlan, order: list[int], logits: torch.Tensor) -> list[Seq]:
        """One token for each item whose KV now covers all its tokens; the scheduler's
        ``update`` appends it, stamps times and finishes requests at ``max_tokens``."""
        greedy = logits.argmax(-1).tolist()
        token_ids = [0] * len(plan.items)
        sampled: list[int] = []
        row = 0
        for i in order:  # logits rows follow the packed (decode-first) order
            seq, n = plan.items[i]
            if seq.num_computed + n != seq.num_tokens:
                continue  # a prefill chunk with more to come
            tok = greedy[row]
            if seq.temperature > 0:
                probs = torch.softmax(logits[row] / seq.temperature, -1)
                tok = int(torch.multinomial(probs, 1, generator=seq.generator))
            token_ids[i] = tok
            sampled.append(i)
            row += 1
        now = time.perf_counter()
        done = {id(s) for s in self.scheduler.update(plan, now, token_ids)}
        self.scheduler.finished.clear()  # a server runs for days: keep no history here
        finished: list[Seq] = []
        for i in sorted(sampled):
            seq, tok = plan.items[i][0], token_ids[i]
            if id(seq) in done:
                seq.finish_reason = "length"
            elif tok in seq.stop_ids:
                self._finish(seq, "stop")
            if seq.on_token is not None:
                seq.on_token(seq, tok)
            if seq.finished:
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
        return [list(s.output) for s in seqs]

    def close(self) -> None:
        self.graphs = None  # their pool goes; they hold raw KV addresses
        self.kv.close()
