"""pd-split on ``host`` and ``gpu``: the real handover (:mod:`workbench.pd.real`) between two mini
engines, against one colocated mini engine on the same requests.

Requests run one at a time (low load, the seed's first E7 step): the TTFT split isolates what the
handover costs (prefill, decode wait, transfer) and the tokens show it changed nothing. With
``gpus=2`` the prefill engine sits on GPU 0 and the decode engine on GPU 1 (a device-to-device
copy); ``gpus=1`` puts both on GPU 0 (a copy within the device): PD and colocated then share one
GPU, so only the handover's mechanism and cost are shown, not PD's performance advantage. On
``host`` both engines keep their KV in host memory (a host copy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from workbench.backends import capabilities, cuda_device_count
from workbench.errors import ConfigError
from workbench.units import MiB


@dataclass(frozen=True, slots=True)
class Placement:
    prefill: str  # torch devices
    decode: str
    colocated: str
    words: str  # for the report and the record
    shared: bool  # PD and colocated on one device: no performance comparison


def placement(backend: str, gpus: int) -> Placement:
    """Where the engines go; refuses (one line) what this host cannot give."""
    if not capabilities(backend).cuda:
        return Placement("cpu", "cpu", "cpu", "host backend: both engines in this process, "
                         "KV in host memory (host VMM device); the handover is a host copy", True)
    if gpus not in (1, 2):
        raise ConfigError(f"gpus={gpus}", "the real handover runs one prefill engine and one "
                          "decode engine", "use gpus=2 (one GPU each) or gpus=1 (both on one)")
    have = cuda_device_count()
    if have < gpus:
        raise ConfigError(f"lab 'pd-split' on backend {backend!r} with gpus={gpus}",
                          f"needs one GPU for prefill and one for decode and this host shows "
                          f"{have}", "run on a 2-GPU host, or pass --param gpus=1 (both engines "
                          "share one GPU: the handover's cost, not PD's advantage)")
    if gpus == 1:
        return Placement("cuda:0", "cuda:0", "cuda:0",
                         "gpus=1: prefill, decode and colocated engines all on GPU 0; PD and "
                         "colocated share one GPU, so this shows the handover's mechanism and "
                         "cost, not PD's performance advantage", True)
    return Placement("cuda:0", "cuda:1", "cuda:0",
                     "gpus=2: prefill engine on GPU 0, decode engine on GPU 1 (device-to-device "
                     "copy); the colocated control runs on GPU 0", False)


def models_on(cfg, devices: list[str]) -> dict[str, Any]:
    """One model per device; every device after the first gets a copy of the first one's
    weights (so PD on two GPUs runs the colocated engine's exact model)."""
    import torch

    from workbench.mini.model import build_model

    first = build_model(cfg, devices[0])
    models = {devices[0]: first}
    for dev in devices[1:]:
        if dev in models:
            continue
        with torch.inference_mode():
            twin = build_model(cfg, dev)
            for mine, theirs in zip(twin.parameters(), first.parameters(), strict=True):
                mine.copy_(theirs)
        models[dev] = twin
    return models


def _engine(cfg, model, device: str, kv_bytes: int, name: str):
    import torch

    from workbench.mini.engine import Engine
    from workbench.mini.kv import KVSpec
    from workbench.pd.kvcopy import on_device

    with on_device(torch.device(device)):
        eng = Engine(cfg, KVSpec(backend="vmm", kv_bytes=kv_bytes), device, model=model,
                     name=name)
        eng.generate([[1] * 40], 3)  # compile the kernels, map the first pages
    eng.stats.steps.clear()
    return eng


def _colocated(eng, prompt: list[int], n: int) -> tuple[list[int], dict[str, float]]:
    from workbench.pd.kvcopy import on_device

    with on_device(eng.device):
        seq = eng.add_request(prompt, n)
        while eng.has_work():
            eng.step()
    ms = 1e3
    return list(seq.output), {"ttft": round((seq.first_token - seq.arrival) * ms, 3),
                              "decode": round((seq.finish - seq.first_token) * ms, 3)}


def run_real(backend: str, model: str, gpus: int, lens: tuple[int, ...],
             max_tokens: int) -> dict[str, Any]:
    """Each prompt through the colocated engine, then through the PD pair; one row each."""
    from workbench.mini.model import get_config
    from workbench.pd.kvcopy import block_nbytes
    from workbench.pd.real import PDPair

    where = placement(backend, gpus)
    name = model or ("llama-3.1-8b" if capabilities(backend).cuda else "tiny")
    cfg = get_config(name)
    models = models_on(cfg, [where.prefill, where.decode, where.colocated])
    kv_bytes = max(32 * MiB, 2 * (max(lens) + max_tokens) * cfg.kv_bytes_per_token)
    colo = _engine(cfg, models[where.colocated], where.colocated, kv_bytes, "colocated")
    pair = PDPair(_engine(cfg, models[where.prefill], where.prefill, kv_bytes, "prefill"),
                  _engine(cfg, models[where.decode], where.decode, kv_bytes, "decode"))
    block_bytes = block_nbytes(pair.prefill.kv)
    rows = []
    t0 = time.perf_counter()
    try:
        for i, n in enumerate(lens):
            prompt = [(i * 7919 + j * 104_729) % cfg.vocab_size for j in range(n)]
            if i % 2 == 0:  # alternate which side runs first (seed 003 §2)
                want, c = _colocated(colo, prompt, max_tokens)
                got = pair.generate([prompt], max_tokens)[0]
            else:
                got = pair.generate([prompt], max_tokens)[0]
                want, c = _colocated(colo, prompt, max_tokens)
            t = pair.times[f"pd-{i}"]
            s = t.copy.seconds if t.copy else 0.0
            rows.append({"prompt_len": n, "output_len": len(got), "tokens_equal": got == want,
                         "first": "colocated" if i % 2 == 0 else "pd",
                         "colocated_ms": c, "pd_ms": t.split_ms(),
                         "blocks": t.copy.blocks if t.copy else 0,
                         "transfer_bytes": t.copy.nbytes if t.copy else 0,
                         "transfer_GBps": round(t.copy.nbytes / s / 1e9, 3) if s else None,
                         "copy": t.copy.placement if t.copy else None})
        leaks = {e.scheduler.name: e.kv.manager.used_blocks
                 for e in (pair.prefill, pair.decode, colo)}
    finally:
        pair.close()
        for e in (pair.prefill, pair.decode, colo):
            e.close()
    return {"rows": rows, "model": name, "placement": where.words, "shared": where.shared,
            "devices": {"prefill": where.prefill, "decode": where.decode,
                        "colocated": where.colocated},
            "block_bytes": block_bytes, "leaked_blocks": leaks,
            "wall_s": round(time.perf_counter() - t0, 3)}
