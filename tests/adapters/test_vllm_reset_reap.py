"""An idle vLLM runs no scheduler step, and on CUDA a page emptied by a free waits for its fence
until the next step reaps it: after ``/reset_prefix_cache`` on the H200 the cached blocks were
gone (in use 52 -> 4 MiB) but their pages stayed mapped (52 MiB). The elastic pool's reset waits
for its own fences and releases the pages before it returns."""

from __future__ import annotations

from tests.adapters import vllm_fake
from workbench.config import PoolConfig
from workbench.core.events import PageState
from workbench.core.geometry import KVGeometry, Layout
from workbench.units import MiB


class Fence:
    """A CUDA event's stand-in: the kernels queued before it are still running until waited."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_reset_prefix_cache_unmaps_the_cached_pages_without_another_step(monkeypatch):
    vllm_fake.install(monkeypatch)
    from workbench.adapters.vllm import registry
    from workbench.adapters.vllm.ledger import BlockLedger
    from workbench.adapters.vllm.pool import ElasticBlockPool
    from workbench.backends import make_device

    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=128 * 1024, block_size=1, num_blocks=64,
                     num_buffers=1, dtype_bytes=1, page_size=2 * MiB, layout=Layout.CONTIGUOUS)
    dev = make_device("sim", name="reset-reap", capacity=geo.num_pages * 2 * MiB + 64 * MiB)
    kv = BlockLedger(geo, dev, name="reset-reap", defer_release=True,
                     config=PoolConfig(min_reserved_pages=0, max_reserved_pages=0))
    kv.fence = Fence
    registry.register(64, kv)
    try:
        pool = ElasticBlockPool(64, True, 16)
    finally:
        registry.ledgers.remove((64, kv))
    blocks = pool.get_new_blocks(40)  # pages 0-2 (page 0 holds the null block)
    for i, b in enumerate(blocks):
        pool.cache_block(b, ("h", i))
    pool.free_blocks(blocks)  # cached, ref 0: the prefix cache keeps them (and their pages)
    assert kv.pages.mapped_pages == 3
    assert pool.reset_prefix_cache()
    assert kv.pages.mapped_pages == 1  # the null block's page only; nothing waits on a step
    assert all(kv.pages.state[q] is not PageState.RETIRED for q in range(geo.num_pages))
    kv.check_invariants()
    kv.close()
