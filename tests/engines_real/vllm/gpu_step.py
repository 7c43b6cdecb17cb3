"""vLLM 0.26 on a CUDA GPU, the engine core in this process (so the pool's event log is readable
here): a batch whose decode outgrows the reserve; prints one ``RESULT {json}`` saying where each
refill of the reserve ran: inside a step's refill (the ``step-refill`` patch, while the forward
pass ran) or inline, in an allocation.

``python gpu_step.py MODEL_DIR`` with ``WORKBENCH_KV_AUTOPATCH=1``, ``WORKBENCH_KV_IPC_NAME``
and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` set; ``VLLM_USE_V2_MODEL_RUNNER`` picks the runner.
"""

from __future__ import annotations

import json
import sys


def main(model: str) -> None:
    from vllm import LLM, SamplingParams

    from workbench.adapters import boot
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.ledger import BlockLedger

    windows: list[tuple[int, int]] = []  # event-log spans of the step refills
    refill = BlockLedger.refill_in_step

    def watched(self):
        start = len(self.events)
        try:
            return refill(self)
        finally:
            windows.append((start, len(self.events)))

    BlockLedger.refill_in_step = watched
    llm = LLM(model=model, tokenizer=model, dtype="bfloat16", enforce_eager=True, seed=0,
              gpu_memory_utilization=0.3, max_model_len=512, max_num_seqs=32, block_size=16,
              enable_prefix_caching=False, attention_backend="TRITON_ATTN",
              compilation_config={"mode": 0, "custom_ops": ["none"]})
    sp = SamplingParams(max_tokens=160, temperature=0.0, ignore_eos=True)
    outs = llm.generate([f"request {i} " * (4 + i % 9) for i in range(32)], sp)
    kv = registry.ledgers[-1][1]
    events = kv.events.events
    first = windows[0][0] if windows else len(events)

    def in_window(i: int) -> bool:
        return any(a <= i < b for a, b in windows)

    prealloc = [i for i, e in enumerate(events) if e.page >= 0 and e.cause == "prealloc"]
    print("RESULT " + json.dumps({
        "patches": [r["patch"] + ":" + r["status"] for r in boot.status()],
        "finished": sum(o.finished for o in outs), "steps_seen": len(windows),
        "refills_in_steps": sum(in_window(i) for i in prealloc),
        "refills_inline_after_first_step": sum(i >= first and not in_window(i)
                                              for i in prealloc),
        "maps_inline": sum(e.page >= 0 and e.cause == "map" for e in events),
        "min_reserved": kv.pages.min_reserved}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
