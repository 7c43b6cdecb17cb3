"""vLLM-like scheduler (V1 style; seed 001 §2, §5): one token budget per step shared by decodes
and (chunked) prefills, continuous batching, recompute preemption on an allocation miss.

Order per step: running requests first (each gets the tokens it still needs, capped by the
budget); if one cannot get its blocks, the *last* running request is preempted (its blocks freed,
its KV recomputed later) and the allocation retried, down to preempting the request itself. Only
when nothing was preempted are waiting requests admitted, each after a prefix-cache lookup.
"""

from __future__ import annotations

from typing import Protocol

from workbench.engines.sched.block_pool import BlockPool, hash_chain
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sched.scheduler import Scheduler, StepPlan, cdiv, make_plan


class KVConnector(Protocol):
    """An external KV source (a tier model): how many leading tokens beyond the local hit it can
    load, and the commitment to load them once the request's blocks are allocated."""

    def lookup(self, req: Request, local_tokens: int) -> int: ...

    def load(self, req: Request, local_tokens: int, tokens: int) -> None: ...


class VLLMKVManager:
    """Per-request block tables on a :class:`BlockPool` (vLLM's KVCacheManager role)."""

    def __init__(self, pool: BlockPool, group_ids: tuple[int, ...] = (0,)):
        self.pool = pool
        self.block_size = pool.block_size
        self.caching = pool.enable_caching
        self.group_ids = group_ids

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Leading cached blocks of ``req`` (at least one token is always left to compute)."""
        if not self.caching:
            return []
        bs = self.block_size
        req.block_hashes = hash_chain(req.tokens, bs, req.block_hashes)
        out: list[int] = []
        for h in req.block_hashes[:(req.num_tokens - 1) // bs]:
            got = self.pool.get_cached_block(h, self.group_ids)
            if got is None:
                break
            out.append(got[0])
        return out

    def allocate_slots(self, req: Request, num_new: int, computed: list[int] = ()) -> bool:
        """Blocks for ``num_new`` more tokens (after ``computed`` hit blocks); False on a miss."""
        bs, pool = self.block_size, self.pool
        hit = len(computed) * bs
        need = cdiv(req.num_computed + hit + num_new, bs) - len(req.blocks) - len(computed)
        if need <= 0 and not computed:
            return True  # the hot path: a decode inside its last block
        if computed:
            reviving = sum(1 for b in computed if pool.ref[b] == 0)
            if need + reviving > pool.num_free_blocks():
                return False
            pool.touch(computed)
        new = pool.get_new_blocks(max(need, 0))
        if new is None:
            if computed:
                pool.free_blocks(reversed(computed))
            return False
        req.blocks.extend(computed)
        req.blocks.extend(new)
        req.num_computed += hit
        if self.caching:
            full = (req.num_computed + num_new) // bs
            if full > req.num_cached_blocks:
                req.block_hashes = hash_chain(req.tokens[:full * bs], bs, req.block_hashes)
                pool.cache_full_blocks(req.blocks, req.block_hashes, req.num_cached_blocks, full)
                req.num_cached_blocks = full
        return True

    def free(self, req: Request) -> None:
        self.pool.free_blocks(reversed(req.blocks))  # tail first: evicted before the prefix
        req.blocks = []
        req.num_cached_blocks = 0


class VLLMScheduler(Scheduler):
    def __init__(self, kvm: VLLMKVManager, *, name: str = "vllm", max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, chunked_prefill: bool = True,
                 max_model_len: int | None = None, connector: KVConnector | None = None):
        super().__init__(name, max_num_seqs)
        self.connector = connector
        self.kvm = kvm
        self.budget = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.max_model_len = max_model_len

    def add_request(self, req: Request) -> None:
        if self.max_model_len and req.prompt_len + req.max_new_tokens > self.max_model_len:
            req.state = ReqState.REJECTED
            self.finished.append(req)
            return
        super().add_request(req)

    def schedule(self) -> StepPlan:
        budget, kvm, stats = self.budget, self.kvm, self.stats
        items: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        running = self.running
        i = 0
        bs = kvm.block_size
        while i < len(running) and budget > 0:
            req = running[i]
            n = len(req.tokens) - req.num_computed
            if n > budget:
                n = budget
            if req.num_computed + n <= len(req.blocks) * bs:  # fits its blocks: no allocation
                items.append((req, n))
                budget -= n
                i += 1
                continue
            while not kvm.allocate_slots(req, n):
                stats.misses += 1
                victim = running.pop()
                kvm.free(victim)
                self._requeue(victim)
                preempted.append(victim)
                if victim is req:
                    n = 0
                    break
            if n == 0:
                break
            items.append((req, n))
            budget -= n
            i += 1
        if preempted:
            return make_plan(items, "mixed", preempted)
        waiting = self.waiting
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            computed = kvm.get_computed_blocks(req) if req.num_computed == 0 else []
            hit = len(computed) * kvm.block_size
            ask = self.connector is not None and req.num_computed == 0
            ext = self.connector.lookup(req, hit) if ask else 0  # loaded, not computed
            n = req.num_tokens - req.num_computed - hit - ext
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not kvm.allocate_slots(req, n + ext, computed):
                stats.misses += 1
                break
            if ask:  # a miss still pays its lookup
                self.connector.load(req, hit, ext)
                req.num_computed += ext
            waiting.popleft()
            if req.first_scheduled is None:
                req.first_scheduled = -1.0  # the driver stamps the time
                req.prefix_hit_tokens = hit
                stats.prefix_queries += 1
                stats.prefix_hit_tokens += hit
                stats.prompt_tokens += req.prompt_len
            req.state = ReqState.RUNNING
            running.append(req)
            items.append((req, n))
            budget -= n
        return make_plan(items, "mixed", preempted)

    def release(self, req: Request, finished: bool) -> None:
        self.kvm.free(req)
