"""vLLM 0.26 on a CUDA GPU with its engine core in a process of its own (vLLM's default): a batch
of requests, then the engine left idle; prints one ``RESULT {json}`` of what the pool's control
segment says from here (the pool lives in the engine-core process).

``python gpu_idle.py MODEL_DIR`` with ``WORKBENCH_KV_AUTOPATCH=1`` and ``WORKBENCH_KV_IPC_NAME``
set. After the last request the engine runs no step: pages its frees retired wait for their
fence, and only the idle loop's tidy-up releases them and refills the reserve.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(model: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, tokenizer=model, dtype="bfloat16", enforce_eager=True, seed=0,
              gpu_memory_utilization=0.3, max_model_len=512, max_num_seqs=32, block_size=16,
              enable_prefix_caching=False, attention_backend="TRITON_ATTN",
              compilation_config={"mode": 0, "custom_ops": ["none"]})
    name = os.environ["WORKBENCH_KV_IPC_NAME"]
    out: dict = {"before": _segment(name)}
    sp = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    outs = llm.generate([f"request {i} " * (4 + i % 9) for i in range(48)], sp)
    out["finished"] = sum(o.finished for o in outs)
    out["just_after"] = info = _segment(name)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:  # no call into the engine from here on
        info = _segment(name)
        if info["mapped"] == info["used"] + info["reserved"] \
                and info["used"] == info["page_id_bytes"]:  # the null block's page alone
            break
        time.sleep(0.05)
    out.update(settled=info, waited_s=round(time.monotonic() - t0, 2))
    print("RESULT " + json.dumps(out), flush=True)


def _segment(name: str) -> dict:
    from workbench.core import control

    info = control.read_segment(name).to_dict()
    info.pop("page_states", None)
    return info


if __name__ == "__main__":
    main(sys.argv[1])
