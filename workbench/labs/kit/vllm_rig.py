"""What every lab's real-vLLM runner (``LAB/vllm.py``) needs: the interpreter with vLLM, the
tiny model, engines started side by side, prompts by token id, vLLM's own counters from
``/metrics``, and the one check a lab's ``engine`` parameter gets."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

from workbench.engines.real.client import Sampling
from workbench.engines.real.vllm import VllmEngine, VllmSpec, require_vllm
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

VOCAB_LO, VOCAB_HI = 3, 1000  # the tiny model's ids past its special tokens
LOGS: list[Path] = []  # where engine logs are kept; else WORKBENCH_VLLM_LOGS when set


def device_of(backend: str) -> str:
    """The torch device a real vLLM on ``backend`` computes on (``cpu``, ``cuda``)."""
    from workbench.backends import capabilities

    return capabilities(backend).torch_device or "cpu"


def model_dir(python: str, root: Path) -> str:
    """The tiny random Llama (built once per run, by the interpreter that has transformers)."""
    out = root / "tiny-llama"
    subprocess.run([python, "-m", "workbench.engines.real.tinymodel", str(out)], check=True,
                   capture_output=True, text=True)
    return str(out)


def prompts(n: int, shared: int, tail: int, seed: int) -> list[list[int]]:
    """``n`` prompts of exactly ``shared + tail + 2*i`` tokens: a shared head (prefix hits),
    then each its own tail."""
    import random

    rng = random.Random(seed)
    head = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(shared)]
    return [head + [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(tail + 2 * i)]
            for i in range(n)]


def start_all(engines: list[VllmEngine]) -> list[VllmEngine]:
    """Start every engine at once (imports and start-up overlap); close all if one fails. The
    processes are launched from this thread (they die with the thread that started them)."""
    errors: list[BaseException] = []
    try:
        for e in engines:
            e.launch()
    except BaseException:
        for e in engines:
            e.close()
        raise

    def go(e: VllmEngine) -> None:
        try:
            e.ready()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=go, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for e in engines:
            e.close()
        raise errors[0]
    return engines


def send(eng: VllmEngine, batch: list[list[int]], n: int, sampling: Sampling,
         first_rid: int = 0) -> list[list[int]]:
    """One wave, all at once; the output token ids per prompt ([] for a lost request)."""
    eng.sampling = sampling
    eng._sender.sampling = sampling
    reqs = [Request(rid=first_rid + i, prompt=p, max_new_tokens=n) for i, p in enumerate(batch)]
    eng.submit(reqs)
    eng.advance()
    return [eng.outcome(r.rid).token_ids for r in reqs]


def counters(eng: VllmEngine) -> dict[str, float]:
    """vLLM's own Prometheus counters (preemptions, prefix-cache queries and hits)."""
    import httpx

    text = httpx.get(eng.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for name in ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
                 "num_requests_running", "num_requests_waiting"):
        m = re.findall(rf"^vllm:{name}(?:_total)?\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
        if m:
            out[name] = float(m[0])
    return out


def engine(name: str, backend: str, model: str, python: str, root: Path, *, elastic: bool,
           **kw) -> VllmEngine:
    spec = VllmSpec(model=model, device=device_of(backend), elastic=elastic, python=python, **kw)
    logs = LOGS[0] if LOGS else os.environ.get("WORKBENCH_VLLM_LOGS") or None
    return VllmEngine(name, spec, workdir=root, keep_log=logs)


def workroot() -> Path:
    """A scratch folder for one run, removed with its engines also on SIGTERM/SIGINT/exit."""
    from workbench.engines.real.procs import Reaper, install_handlers

    root = Path(tempfile.mkdtemp(prefix="wb-vllm-lab-"))
    install_handlers()
    Reaper(folders=[root])  # registered; closed by the handlers (run() also removes it)
    return root


def on_real(backend: str, engine: str) -> bool:
    """``engine=vllm`` on a real backend (``host``, ``gpu``): the lab runs on a real vLLM."""
    from workbench.backends import capabilities

    return engine == "vllm" and not capabilities(backend).simulated


def check_engine(lab: str, backend: str, engine: str, own: str) -> bool:
    """True when lab ``lab`` runs on a real vLLM: ``engine=vllm`` on ``host``/``gpu`` (refused in
    one line, with how to get it, where no vLLM is importable). ``own`` is the lab's own engine
    there (``mini``) or on ``sim`` (``vllm``: the simulated vLLM-like engine); any other name is
    refused."""
    from workbench.backends import capabilities

    real = not capabilities(backend).simulated
    names = ("vllm", own) if real else (own,)
    if engine not in names:
        where = "a real vLLM" if real else "the simulated vLLM-like engine"
        raise ConfigError(f"lab {lab!r} parameter engine={engine!r} on backend {backend!r}",
                          f"is not an engine it runs (vllm: {where})",
                          f"use engine={' or engine='.join(dict.fromkeys(names))}")
    if real and engine == "vllm":
        python_for(lab)
        return True
    return False


def python_for(lab: str) -> str:
    return require_vllm(f"lab {lab!r} with engine=vllm")


def device_free(device: str) -> int:
    from workbench.engines.real.vllm import device_free_bytes

    return device_free_bytes(device)


def block_bytes(model: str, block_size: int, dtype_bytes: int = 2) -> int:
    """The KV bytes of one block over every layer (K and V) of the model in folder ``model``:
    what a page id's bytes divide by to give blocks per page."""
    import json

    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return (2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * block_size
            * dtype_bytes)


def cache_config(eng: VllmEngine) -> dict[str, str]:
    """vLLM's own ``cache_config_info`` labels from ``/metrics`` (``block_size``,
    ``num_gpu_blocks``, ...): the block size vLLM chose, which the pool's segment does not
    carry (its ledger counts vLLM blocks, each one block of its geometry)."""
    import httpx

    text = httpx.get(eng.url + "/metrics", timeout=10).text
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}


def blocks_per_page(eng: VllmEngine, page_id_bytes: int) -> tuple[int, int]:
    """(vLLM's block size in tokens, its blocks per page id) for a started engine: the size
    vLLM reports, else the ``--block-size`` it was started with."""
    import httpx

    try:
        size = int(cache_config(eng).get("block_size") or 0)
    except (httpx.HTTPError, ValueError):  # no metrics, or a label that is not a number
        size = 0
    size = size or eng.spec.block_size or (32 if eng.spec.device == "cpu" else 16)
    return size, page_id_bytes // block_bytes(eng.spec.model, size)
