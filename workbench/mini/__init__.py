"""A small real engine whose KV cache lives in the workbench's pool (issue 8).

Module map (one job each):

* ``model``     Llama-architecture decoder (RMSNorm, RoPE, GQA, SwiGLU), seeded random weights;
  its shapes come from the one model registry (``workbench.engines.models``)
* ``kv``        the pool (ledger + virtual range) and per-layer K/V views; ``vmm`` or ``static``
* ``attention`` paged attention: slot writes, Triton/torch decode kernel, SDPA prefill chunks
* ``req_to_token`` the persistent device table of each running request's slots (token style) or
  block ids (block style), written per new entry
* ``graphs``    CUDA graphs of the decode forward, one per captured batch size (padded up to)
* (scheduling: ``workbench.engines.sched.vllm_sched``, shared with the simulated engines)
* ``engine``    one iteration per ``step()``; ``generate()`` for offline use
* ``instance``  the engine behind the Engine protocol (``workbench.engines.base``): arrivals on a
  wall clock, ``advance``, metrics, the pool's memory timeline
* ``server``    OpenAI-compatible ``/v1/completions`` on FastAPI + uvicorn (docs/server.md);
  ``protocol`` its bounded request bodies, ``loop`` the engine thread, ``metrics`` /metrics
* ``client``    load client for any OpenAI-compatible server

Benchmarks of this engine live in ``workbench.bench`` (``mini``, ``ab``, ``steady``,
``decode_kernel``, ``calibrate``), its colocation lab in ``workbench.labs`` (backend ``gpu``).
torch is imported by these modules, never by
``import workbench.mini``.
"""
