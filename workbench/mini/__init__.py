"""A small real engine whose KV cache lives in the workbench's pool (issue 8).

Module map (one job each):

* ``model``     Llama-architecture decoder (RMSNorm, RoPE, GQA, SwiGLU), seeded random weights
* ``kv``        the pool (ledger + virtual range) and per-layer K/V views; ``vmm`` or ``static``
* ``attention`` paged attention: slot writes, Triton/torch decode kernel, SDPA prefill chunks
* (scheduling: ``workbench.engines.sched.vllm_sched``, shared with the simulated engines)
* ``engine``    one iteration per ``step()``; ``generate()`` for offline use
* ``server``    OpenAI-compatible ``/v1/completions`` (SSE streaming), standard library only
* ``client``    load client for any OpenAI-compatible server
* ``bench``     GPU measurements: kernel check, decode throughput VMM vs static, step times

torch is imported by these modules, never by ``import workbench.mini``.
"""
