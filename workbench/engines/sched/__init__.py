"""The pure scheduling part of the engines (seed 001 §2, §5, §6): no SimPy, no torch.

A simulated engine (``workbench.engines.sim``) and a real one (``workbench.mini``) run the same
objects here against a :class:`~workbench.core.ledger.KVCacheManager`:

* ``request``     the request record every scheduler and metric shares
* ``eviction``    page-aware victim selection shared by the block pool and the radix cache
* ``block_pool``  vLLM-style prefix ownership: hash chain, ref counts, LRU, null block
* ``radix_cache`` SGLang-style prefix ownership: radix tree, lock_ref, evictable size
* ``scheduler``   ``Scheduler.schedule() -> StepPlan`` API and shared helpers
* ``vllm_sched``  vLLM-like scheduler: token budget, chunked prefill, recompute preemption
* ``sglang_sched`` SGLang-like scheduler: radix match, extend/decode batches, retract
"""
