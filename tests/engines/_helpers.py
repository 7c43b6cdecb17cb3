from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.events import EventLog, PageState
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.device import SimDevice
from workbench.units import GiB


def make_kv(num_blocks: int = 64, *, blocks_per_page: int = 4, block_size: int = 4,
            max_cached_tokens: int = -1, prealloc: bool = False, max_reserved: int = 0,
            device: SimDevice | None = None, name: str = "pool") -> KVCacheManager:
    """A small pool: ``blocks_per_page`` blocks on each 2 MiB page, one layer."""
    heads = (2 << 20) // (blocks_per_page * block_size * 2 * 64)
    geo = KVGeometry(num_layers=1, kv_heads=heads, head_dim=64, block_size=block_size,
                     num_blocks=num_blocks)
    assert geo.page_size // geo.block_bytes == blocks_per_page
    cfg = PoolConfig(prealloc=prealloc, min_reserved_pages=0, max_reserved_pages=max_reserved,
                     max_cached_tokens=max_cached_tokens)
    return KVCacheManager(geo, device or SimDevice("h200", capacity=4 * GiB), name=name,
                          config=cfg, events=EventLog(keep=False))


def in_use_pages(kv: KVCacheManager) -> int:
    return kv.pages.counts[PageState.IN_USE]


@pytest.fixture
def kv():
    return make_kv()


def run_single(kind: str, requests, *, num_blocks: int = 256, blocks_per_page: int = 4,
               block_size: int = 16, caching: bool = True, max_cached_tokens: int = -1,
               budget: int = 2048, max_num_seqs: int = 256, until: float = 1e5):
    """One vLLM-like or SGLang-like instance on a small pool; runs ``requests`` to completion."""
    import simpy

    from workbench.engines.sim.kvsetup import InstanceKV
    from workbench.engines.sim.sglang_like import SGLangLikeEngine, SGLangOptions
    from workbench.engines.sim.steptime import StepTimeModel
    from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions

    env = simpy.Environment()
    dev = SimDevice("h200", env=env, capacity=4 * GiB)
    kv = make_kv(num_blocks, blocks_per_page=blocks_per_page, block_size=block_size,
                 max_cached_tokens=max_cached_tokens, device=dev, name=kind)
    ikv = InstanceKV(kv, "elastic", None)
    st = StepTimeModel.preset("llama-3.1-8b", "h200")
    if kind == "vllm":
        eng = VLLMLikeEngine(env, kind, ikv, st, options=VLLMOptions(
            enable_prefix_caching=caching, max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs))
    else:
        eng = SGLangLikeEngine(env, kind, ikv, st, options=SGLangOptions(
            enable_radix_cache=caching, max_num_seqs=max_num_seqs))
    eng.submit(requests)
    total = len(requests)

    def watch():
        while len(eng.scheduler.finished) < total and env.now < until:
            yield env.timeout(0.05)

    env.run(until=env.process(watch()))
    return eng
