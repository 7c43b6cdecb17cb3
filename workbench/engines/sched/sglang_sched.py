"""SGLang-like scheduler (seed 001 §2, §5): radix match, extend *or* decode batches, retract.

Each step is either an **extend** batch (new requests' uncached suffixes, at most one request
chunked at a time) or a **decode** batch (one token per running request); extends go first, as in
SGLang's event loop. Admission is conservative: a request enters only if the free KV (evictable
cache included) covers its extend tokens plus ``new_token_ratio`` of the decode tokens every
running request may still need. A decode step that cannot get its KV *retracts* requests (fewest
decoded tokens first; their computed KV goes into the radix tree) and raises the ratio.

After an extend the request's computed prefix goes into the tree (SGLang's
``cache_unfinished_req``), so requests that arrive while it decodes share it. KV is allocated in
runs (the blocks needed now plus up to ``run_blocks`` future decode blocks, from free headroom)
so a request's radix leaf sits on one VMM page and page-aware eviction can empty whole pages.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.engines.sched.radix_cache import RadixCache
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sched.scheduler import Scheduler, StepPlan, cdiv, make_plan


class SGLangScheduler(Scheduler):
    def __init__(self, cache: RadixCache, *, name: str = "sglang", max_num_seqs: int = 256,
                 max_prefill_tokens: int = 16384, chunked_prefill_size: int = 8192,
                 init_new_token_ratio: float = 0.7, min_new_token_ratio: float = 0.1,
                 new_token_ratio_decay: float = 0.001, retract_step: float = 0.1,
                 run_blocks: int = 8):
        super().__init__(name, max_num_seqs)
        self.cache = cache
        self.page = cache.page
        self.max_prefill_tokens = max_prefill_tokens
        self.chunk = chunked_prefill_size
        self.new_token_ratio = init_new_token_ratio
        self.init_ratio = init_new_token_ratio
        self.min_ratio = min_new_token_ratio
        self.decay = new_token_ratio_decay
        self.retract_step = retract_step
        self.chunked: Request | None = None  # a prefill that spans several extend batches
        self.run_blocks = run_blocks  # decode blocks taken ahead with an allocation (0: none)

    # -- extend ------------------------------------------------------------------------------
    def _reserved_decode_tokens(self) -> float:
        r, page = self.new_token_ratio, self.page
        return sum(max(0.0, min(q.max_new_tokens - q.output_len, 4096) * r
                       - (len(q.blocks) * page - q.num_computed)) for q in self.running)

    def _grow(self, req: Request, upto: int) -> bool:
        need = cdiv(upto, self.page) - len(req.blocks)
        if need <= 0:
            return True
        # Take up to run_blocks of the request's future decode blocks in the same call, so the
        # ledger's best fit puts its radix leaf on one VMM page rather than one block on each of
        # ~10 pages (that scatter pins pages at idle). Only from free headroom: it never evicts
        # and leaves one block per running request for the next decode step.
        ids = None
        final = cdiv(req.prompt_len + req.max_new_tokens - 1, self.page)
        extra = min(self.run_blocks, final - len(req.blocks) - need)
        kv = self.cache.kv
        if extra > 0 and kv.available_size() >= need + extra + len(self.running):
            ids = kv.alloc(need + extra)
        if ids is None:
            ids = self.cache.alloc(need)
        if ids is None:
            self.stats.misses += 1
            return False
        req.blocks.extend(ids)
        return True

    def _schedule_extend(self) -> list[tuple[Request, int]]:
        items: list[tuple[Request, int]] = []
        budget = self.max_prefill_tokens
        cache, page = self.cache, self.page
        if self.chunked is not None:
            req = self.chunked
            n = min(req.num_tokens - req.num_computed, self.chunk, budget)
            if self._grow(req, req.num_computed + n):
                items.append((req, n))
                budget -= n
                if req.num_computed + n >= req.num_tokens:
                    self.chunked = None
                    self.running.append(req)
            return items  # SGLang runs a chunked request's next chunk on its own
        free_tokens = cache.available_blocks() * page - self._reserved_decode_tokens()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            blocks, node = cache.match_prefix(req.tokens[:req.num_tokens - 1])
            hit = len(blocks) * page
            extend = req.num_tokens - hit
            want = extend + (req.max_new_tokens - req.output_len) * self.new_token_ratio
            if want > free_tokens or (items and extend > budget):
                break
            n = min(extend, self.chunk, budget)
            cache.inc_lock_ref(node)
            req.blocks, req.node, req.num_computed = list(blocks), node, hit
            if not self._grow(req, hit + n):
                cache.dec_lock_ref(node)
                req.blocks, req.node, req.num_computed = [], None, 0
                break
            self.waiting.popleft()
            if req.first_scheduled is None:
                req.first_scheduled = -1.0
                req.prefix_hit_tokens = hit
                self.stats.prefix_queries += 1
                self.stats.prefix_hit_tokens += hit
                self.stats.prompt_tokens += req.prompt_len
            req.state = ReqState.RUNNING
            items.append((req, n))
            budget -= n
            free_tokens -= want
            if n < extend:
                self.chunked = req
                break
            self.running.append(req)
        return items

    # -- decode ------------------------------------------------------------------------------
    def _schedule_decode(self) -> tuple[list[tuple[Request, int]], list[Request]]:
        retracted: list[Request] = []
        page = self.page
        while self.running:
            need = sum(1 for r in self.running if cdiv(r.num_computed + 1, page) > len(r.blocks))
            if need <= self.cache.available_blocks():
                break
            self.stats.misses += 1
            victim = min(self.running, key=lambda r: (r.output_len, -r.prompt_len, -r.rid))
            self.running.remove(victim)
            self.release(victim, finished=False)
            self._requeue(victim)
            retracted.append(victim)
            self.new_token_ratio = min(1.0, self.new_token_ratio + self.retract_step)
        items = []
        for r in self.running:
            if not self._grow(r, r.num_computed + 1):  # covered above; a miss here retracts next
                continue
            items.append((r, 1))
        self.new_token_ratio = max(self.min_ratio, self.new_token_ratio - self.decay)
        return items, retracted

    def schedule(self) -> StepPlan:
        if self.waiting or self.chunked is not None:
            items = self._schedule_extend()
            if items:
                return make_plan(items, "extend", [])
        items, retracted = self._schedule_decode()
        return make_plan(items, "decode", retracted)

    def update(self, plan: StepPlan, now: float,
               token_ids: Sequence[int] | None = None) -> list[Request]:
        done = super().update(plan, now, token_ids)
        if plan.kind == "extend" and self.cache.enable_caching:
            for req, _ in plan.items:  # SGLang: "this updates radix so others can match"
                if req.node is not None and req.state is ReqState.RUNNING:
                    self._cache_unfinished(req)
        return done

    def _cache_unfinished(self, req: Request) -> None:
        computed = min(req.num_computed, len(req.blocks) * self.page)
        k = computed // self.page
        if k == 0:
            return
        blocks, req.node = self.cache.cache_unfinished(req.tokens[:k * self.page],
                                                        req.blocks[:k], req.node)
        req.blocks[:k] = blocks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    # -- finish / retract: the computed KV goes into the tree --------------------------------
    def release(self, req: Request, finished: bool) -> None:
        cache, page = self.cache, self.page
        computed = min(req.num_computed, len(req.blocks) * page)
        aligned = computed - computed % page
        k = aligned // page
        if cache.enable_caching and k:
            prefix = cache.insert(req.tokens[:aligned], req.blocks[:k])
            # blocks of the already-cached range that the tree does not hold are duplicates
            cache.free([b for b in req.blocks[:prefix // page] if b not in cache.owner])
            cache.free(req.blocks[k:])
        else:
            cache.free(req.blocks)
        if req.node is not None:
            cache.dec_lock_ref(req.node)
            req.node = None
        req.blocks = []
        cache.enforce_cap()
