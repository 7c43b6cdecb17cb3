"""Simulated serving engines (seed 001 §2, §5, §6): prefix ownership, schedulers, SimPy drivers.

Module map (one concept each):

* ``models``      model presets (layers, heads, params) and their :class:`KVGeometry`
* ``steptime``    roofline step-time model per GPU preset
* ``request``     the request record every scheduler and metric shares
* ``eviction``    page-aware victim selection shared by the block pool and the radix cache
* ``block_pool``  vLLM-style prefix ownership: hash chain, ref counts, LRU, null block
* ``radix_cache`` SGLang-style prefix ownership: radix tree, lock_ref, evictable size
* ``scheduler``   ``Scheduler.schedule() -> StepPlan`` API (no SimPy) and shared helpers
* ``vllm_sched``  vLLM-like scheduler: token budget, chunked prefill, recompute preemption
* ``sglang_sched`` SGLang-like scheduler: radix match, extend/decode batches, retract
* ``driver``      the SimPy step loop that runs any scheduler against simulated time
* ``vllm_like`` / ``sglang_like``  engine builders (static or elastic KV)
* ``workloads``   Poisson, kvcached's ramp trace, prefix groups A-D, long/short mixes
* ``metrics``     TTFT/TPOT/ITL/E2E percentiles, goodput, memory timelines
"""
