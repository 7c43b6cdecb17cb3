"""KV capacity on a real vLLM (seed 000 §4): vLLM's own ``num_gpu_blocks`` (its
``cache_config_info`` metric) against the formula ``KV bytes / bytes per block``, where bytes
per block = 2 (K, V) x layers x KV heads x head dim x block size x dtype bytes. KV bytes: stock
on the CPU vLLM's ``VLLM_CPU_KVCACHE_SPACE``, on CUDA the bytes it is given; elastic, the pool's
virtual capacity from its segment."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from workbench.labs.kit import server_rig as rig
from workbench.units import GiB

STOCK_KV_GPU = 8 * GiB  # the KV bytes stock vLLM is given on CUDA


def cache_info(eng) -> dict[str, str]:
    import httpx

    text = httpx.get(eng.url + "/metrics", timeout=10).text
    m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", text, re.M)
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}


def block_bytes(model: str, block_size: int, dtype_bytes: int = 2) -> int:
    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * block_size \
        * dtype_bytes


def run(backend: str, quick: bool = False) -> dict[str, Any]:
    py = rig.python_for("kv-capacity")
    root = rig.workroot()
    cpu = rig.device_of(backend) == "cpu"
    engines: list = []
    try:
        model = rig.model_dir(py, root)
        # on CUDA stock is told its KV bytes exactly (vLLM's kv_cache_memory_bytes) instead of
        # profiling for them, so its formula has a known numerator as on the CPU
        engines = [rig.engine("kc-stock", backend, model, py, root, elastic=False,
                              kv_cache_bytes=None if cpu else STOCK_KV_GPU),
                   rig.engine("kc-elastic", backend, model, py, root, elastic=True)]
        rig.start_all(engines)
        rows = []
        for e in engines:
            info = cache_info(e)
            blocks, bs = int(info.get("num_gpu_blocks") or 0), int(info.get("block_size") or 0)
            per = block_bytes(model, bs)
            seg = e.kv_pool.info()
            kv = (seg.capacity if seg is not None else
                  int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")) * GiB) if cpu
                  else STOCK_KV_GPU)
            rows.append({"engine": e.name, "num_gpu_blocks": blocks, "block_size": bs,
                         "bytes_per_block": per, "kv_bytes": kv,
                         "formula_blocks": kv // per if kv else None,
                         "blocks_x_bytes": blocks * per,
                         "page_id_bytes": seg.page_id_bytes if seg is not None else None})
        return {"backend": backend, "device": rig.device_of(backend), "rows": rows}
    finally:
        for e in engines:
            e.close()
        shutil.rmtree(root, ignore_errors=True)
