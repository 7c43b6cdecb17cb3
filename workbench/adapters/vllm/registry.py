"""Where the scheduler's block pool finds the physical backing the model runner built.

With one worker in the engine-core process (vLLM on CPU, TP=1) both live in one process: the
runner's ``allocate_kv_cache`` registers its backing here and the BlockPool built right after
picks it up by block count. Without a runner (vLLM's own unit tests, scheduler-only use) the pool
gets a standalone backing on a simulated device: the same page bookkeeping, no memory.
"""

from __future__ import annotations

from workbench.adapters import runtime
from workbench.adapters.vllm.backing import BlockBacking
from workbench.backends import make_device
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.settings import settings

backings: list[tuple[int, BlockBacking]] = []
pools: list = []  # ElasticBlockPools built in this process (reports, tests)
_sim = None


def register(num_blocks: int, backing: BlockBacking) -> None:
    backings.append((num_blocks, backing))


def backing_for(num_blocks: int) -> BlockBacking | None:
    for n, b in reversed(backings):
        if n == num_blocks:
            return b
    return None


def require_worker() -> bool:
    return not settings().vllm_standalone


def standalone_backing(num_blocks: int) -> BlockBacking:
    global _sim
    if _sim is None:
        _sim = make_device("sim", name="vllm-scheduler-only")
    cfg = runtime.pool_config(contiguous_layout=False)
    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=4096, block_size=1,
                     num_blocks=max(2, num_blocks), num_buffers=1, dtype_bytes=1,
                     page_size=cfg.page_size, layout=Layout.PER_LAYER)
    return BlockBacking(KVSpace(geo, _sim), cfg, name="vllm-standalone")


def max_cached_blocks(block_size: int) -> int:
    """``WORKBENCH_KV_MAX_CACHED_TOKENS``: -1 unbounded, 0 none, else at least one block."""
    tokens = runtime.pool_config().max_cached_tokens
    if tokens < 0:
        return -1
    return 0 if tokens == 0 else max(1, tokens // block_size)
