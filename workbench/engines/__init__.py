"""Serving engines behind one interface (seed 001 §2, §5, §6).

* ``base``     the :class:`~workbench.engines.base.Engine` protocol (submit, advance, metrics,
  memory timeline, KV pool) and the seam for the real vLLM / SGLang engines
* ``kinds``    the one registry of engine kinds (``sim-vllm``, ``sim-sglang``, ``mini``,
  ``vllm``, ``sglang``): family, needs, scheduler, versions, title; the old spellings' table
* ``models``   the one model-preset registry (KV geometry, step-time numbers, decoder shapes)
* ``metrics``  TTFT/TPOT/ITL/E2E percentiles, goodput, memory samples
* ``sched``    the pure scheduling part (no SimPy): request, eviction, block pool, radix cache,
  the vLLM-like and SGLang-like schedulers; the mini engine runs the same objects
* ``sim``      the simulated part: SimPy driver, step-time model, KV setup, the simulated
  engines, clusters (one kind or mixed) and workloads

The mini engine's implementation of the protocol is :class:`workbench.mini.instance.MiniInstance`.
"""
