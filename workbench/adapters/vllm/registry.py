"""Where the scheduler's block pool finds the ledger the model runner built.

With one worker in the engine-core process (TP=1, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, vLLM on
CPU or the uniprocess executor on a GPU) both live in one process: the runner's KV allocation
registers its ledger here and the BlockPool built right after picks it up by block count. With
the model runner in other processes (the ``mp`` executor, TP > 1), the scheduler builds its
ledger over a :class:`~workbench.core.coordinator.FanOutSpace` whose page decisions reach every
worker (see ``fanout.py``). Without a runner (vLLM's own unit tests, scheduler-only use) the pool
gets a standalone ledger on a simulated device: the same page bookkeeping, no memory.
"""

from __future__ import annotations

import logging
import weakref

from workbench.adapters import runtime
from workbench.adapters.vllm.ledger import BlockLedger
from workbench.backends import make_device
from workbench.core.geometry import KVGeometry, Layout
from workbench.errors import ConfigError, StateConsistencyError
from workbench.settings import settings

log = logging.getLogger("workbench.autopatch")
ledgers: list[tuple[int, BlockLedger]] = []
# ElasticBlockPools alive in this process (reports, tests); weak, so a pool vLLM drops is
# collected with its manager (vLLM 0.34's own tests check that teardown frees the pools)
pools: weakref.WeakSet = weakref.WeakSet()
_sim = None


def register(num_blocks: int, ledger: BlockLedger) -> None:
    ledgers.append((num_blocks, ledger))
    runtime.ledgers.append(ledger)


def ledger_for(num_blocks: int) -> BlockLedger | None:
    for n, kv in reversed(ledgers):
        if n == num_blocks and not kv.closed:
            return kv
    return None


def require_worker() -> bool:
    return not settings().vllm_standalone


def standalone_ledger(num_blocks: int) -> BlockLedger:
    """Page bookkeeping without memory on a simulated device: 512 blocks per page, or
    ``WORKBENCH_KV_VLLM_BLOCKS_PER_PAGE`` (tests set 4 so that pages really map and unmap)."""
    global _sim
    if _sim is None:
        _sim = make_device("sim", name="vllm-scheduler-only")
    cfg = runtime.pool_config()
    per_page = settings().vllm_blocks_per_page
    if cfg.page_size % per_page:
        raise ConfigError(f"WORKBENCH_KV_VLLM_BLOCKS_PER_PAGE={per_page}",
                          f"must divide the {cfg.page_size}-byte page", "use a power of two")
    layout = Layout.CONTIGUOUS if cfg.contiguous_layout else Layout.PER_LAYER
    geo = KVGeometry(num_layers=1, kv_heads=1, head_dim=cfg.page_size // per_page, block_size=1,
                     num_blocks=max(2, num_blocks), num_buffers=1, dtype_bytes=1,
                     page_size=cfg.page_size, layout=layout)
    # not registered: every scheduler-only pool (vLLM's tests build hundreds) starts afresh
    return BlockLedger(geo, _sim, name="vllm-standalone", config=cfg)


def tidy_idle() -> None:
    """The engine core has no request in flight: each elastic pool's ledger tidies up
    (:meth:`~workbench.adapters.vllm.ledger.BlockLedger.tidy`)."""
    _each_backing("while the engine was idle", lambda kv: kv.tidy())


def refill_in_step() -> None:
    """A step's forward pass is in flight: each elastic pool in this process refills its
    reserve (:meth:`~workbench.adapters.vllm.ledger.BlockLedger.refill_in_step`). With the
    model runner in other processes (TP > 1) this process has no pool, and nothing happens."""
    _each_backing("while a step ran", lambda kv: kv.refill_in_step())


def _each_backing(when: str, call) -> None:
    """``call`` on every elastic pool's ledger. A pool that fails there (an unmap whose undo
    failed, a map whose outcome is unknown) is failed and refuses its next allocation, as it
    would on the request path; the engine's loop itself goes on, with one log line."""
    for pool in list(pools):
        try:
            call(pool.backing)
        except StateConsistencyError as err:
            log.error("workbench: pool %s failed %s: %s", pool.backing.name, when, err)


def own_order() -> bool:
    """``WORKBENCH_KV_VLLM_OWN_ORDER``: keep vLLM's block order even where it maps a page."""
    return settings().vllm_own_order


def max_cached_blocks(block_size: int) -> int:
    """``WORKBENCH_KV_MAX_CACHED_TOKENS``: -1 unbounded, 0 none, else at least one block."""
    tokens = runtime.pool_config().max_cached_tokens
    if tokens < 0:
        return -1
    return 0 if tokens == 0 else max(1, tokens // block_size)
