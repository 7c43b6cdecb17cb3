"""What every lab's real-engine runner (``LAB/vllm.py``) needs, for either real kind (``vllm``:
vLLM's OpenAI server; ``sglang``: SGLang's server, CUDA only): the interpreter with the engine,
the tiny model, engines started side by side, prompts by token id, the engine's own counters, and
the one check a lab's ``engine`` parameter gets. A runner names the kind once; the rest of its
code is the same for both (they share :class:`~workbench.engines.real.vllm.VllmEngine`'s life
cycle and the Engine protocol)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

from workbench.engines.real.client import Sampling
from workbench.engines.real.sglang import SglangEngine, SglangSpec, require_sglang
from workbench.engines.real.vllm import VllmEngine, VllmSpec, require_vllm
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

VOCAB_LO, VOCAB_HI = 3, 1000  # the tiny model's ids past its special tokens
LOGS: list[Path] = []  # where engine logs are kept; else WORKBENCH_VLLM_LOGS when set
KINDS = ("vllm", "sglang")  # the real engine kinds a lab's engine parameter may name
STAND_INS: dict[str, list[str]] = {}  # kind -> a stand-in server's command (tests)


def device_of(backend: str) -> str:
    """The torch device a real vLLM on ``backend`` computes on (``cpu``, ``cuda``)."""
    from workbench.backends import capabilities

    return capabilities(backend).torch_device or "cpu"


def model_dir(python: str, root: Path, kind: str = "vllm") -> str:
    """The tiny random Llama (built once per run, by the interpreter that has transformers);
    for SGLang its ``config.json`` alone (random weights, ``--load-format dummy``; no
    tokenizer, the server takes token ids)."""
    if kind == "sglang":
        from workbench.engines.real.sglang import tiny_llama_config

        return str(tiny_llama_config(root / "tiny-llama-sglang"))
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
    """vLLM's own Prometheus counters (preemptions, prefix-cache queries and hits); {} for
    SGLang (its server runs without ``--enable-metrics``: the labs read its pool's segment and
    each answer's ``cached_tokens`` instead)."""
    import httpx

    if eng.kind == "sglang":
        return {}
    text = httpx.get(eng.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for name in ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
                 "num_requests_running", "num_requests_waiting"):
        m = re.findall(rf"^vllm:{name}(?:_total)?\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
        if m:
            out[name] = float(m[0])
    return out


SGLANG_NAMES = {"max_num_seqs": "max_running_requests", "prefix_caching": "radix_cache"}


def engine(name: str, backend: str, model: str, python: str, root: Path, *, elastic: bool,
           kind: str = "vllm", **kw) -> VllmEngine:
    """One engine of ``kind``. ``kw`` are the kind's spec fields; the two the runners share
    (``max_num_seqs``, ``prefix_caching``) are given vLLM's names and renamed for SGLang."""
    logs = LOGS[0] if LOGS else os.environ.get("WORKBENCH_VLLM_LOGS") or None
    stand_in = STAND_INS.get(kind)
    if stand_in:
        kw.setdefault("server_cmd", stand_in)
    if kind == "sglang":
        kw = {SGLANG_NAMES.get(k, k): v for k, v in kw.items()}
        knobs = kw.setdefault("knobs", {})
        knobs.setdefault("gpu_utilization", "0.45")  # what the H200 run used beside stock
        spec = SglangSpec(model=model, device=device_of(backend), elastic=elastic,
                          python=python, **kw)
        return SglangEngine(name, spec, workdir=root, keep_log=logs)
    spec = VllmSpec(model=model, device=device_of(backend), elastic=elastic, python=python, **kw)
    return VllmEngine(name, spec, workdir=root, keep_log=logs)


def workroot() -> Path:
    """A scratch folder for one run, removed with its engines also on SIGTERM/SIGINT/exit."""
    from workbench.engines.real.procs import Reaper, install_handlers

    root = Path(tempfile.mkdtemp(prefix="wb-vllm-lab-"))
    install_handlers()
    Reaper(folders=[root])  # registered; closed by the handlers (run() also removes it)
    return root


def kind_kw(engine: str) -> dict[str, str]:
    """What a lab passes its runner for ``engine``: nothing for vLLM (the runners' default
    kind), ``kind=`` for another real kind."""
    return {} if engine == "vllm" else {"kind": engine}


def on_real(backend: str, engine: str) -> bool:
    """``engine=vllm`` (or ``sglang``) on a real backend (``host``, ``gpu``): the lab runs on
    that real engine."""
    from workbench.backends import capabilities

    return engine in KINDS and not capabilities(backend).simulated


def check_engine(lab: str, backend: str, engine: str, own: str,
                 kinds: tuple[str, ...] = ("vllm",)) -> bool:
    """True when lab ``lab`` runs on a real engine: ``engine=vllm`` on ``host``/``gpu``, or
    ``engine=sglang`` on ``gpu`` for a lab whose ``kinds`` name it (refused in one line, with
    how to get it, where the engine is not importable). ``own`` is the lab's own engine there
    (``mini``) or on ``sim`` (``vllm``: the simulated vLLM-like engine); any other name is
    refused. Never a fallback: a named engine runs, or the lab does not."""
    from workbench.backends import capabilities, kind

    real = not capabilities(backend).simulated
    if engine == "sglang" and "sglang" in kinds and kind(backend) != "gpu":
        raise ConfigError(f"lab {lab!r} parameter engine=sglang on backend {backend!r}",
                          "the sglang kind runs SGLang's CUDA server only",
                          "use --backend gpu on a CUDA machine, or engine=vllm here")
    names = (*kinds, own) if real else (own,)
    if engine not in names:
        where = (f"a real {' or '.join(kinds)}" if real else "the simulated vLLM-like engine")
        why = ("the lab has no run for that engine yet" if engine in KINDS and real else
               f"is not an engine it runs ({'/'.join(kinds) if real else own}: {where})")
        raise ConfigError(f"lab {lab!r} parameter engine={engine!r} on backend {backend!r}",
                          why, f"use engine={' or engine='.join(dict.fromkeys(names))}")
    if real and engine in KINDS:
        python_for(lab) if engine == "vllm" else python_for(lab, engine)
        return True
    return False


def python_for(lab: str, kind: str = "vllm") -> str:
    """The interpreter that runs ``kind``'s server (a stand-in's own: this one)."""
    import sys

    if STAND_INS.get(kind):
        return sys.executable
    need = require_sglang if kind == "sglang" else require_vllm
    return need(f"lab {lab!r} with engine={kind}")


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
    vLLM reports, else the ``--block-size`` it was started with; SGLang's page size (token
    slots) and its pages per page id."""
    import httpx

    if getattr(eng, "kind", "vllm") == "sglang":  # a ledger block: one SGLang page
        return eng.spec.page_size, page_id_bytes // block_bytes(eng.spec.model,
                                                                eng.spec.page_size)
    try:
        size = int(cache_config(eng).get("block_size") or 0)
    except (httpx.HTTPError, ValueError):  # no metrics, or a label that is not a number
        size = 0
    size = size or eng.spec.block_size or (32 if eng.spec.device == "cpu" else 16)
    return size, page_id_bytes // block_bytes(eng.spec.model, size)
