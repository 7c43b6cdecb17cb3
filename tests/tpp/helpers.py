"""Shared builders for the TP/PP tests: a small geometry and a pool over simulated workers."""

from __future__ import annotations

from typing import Any

from workbench.config import PoolConfig
from workbench.core.coordinator import FanOutSpace, WorkerId, targets_for
from workbench.core.events import EventLog
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.workers import Fault, SimCluster

# 2 layers x K/V, 2 MiB pages: a page id is 8 MiB and holds 512 blocks; 16 page ids.
GEO = KVGeometry(num_layers=2, kv_heads=2, head_dim=64, block_size=16, num_blocks=8192)
BPP = GEO.page_size // GEO.block_bytes  # 512 blocks per page
W0, W1 = WorkerId(0, 0), WorkerId(0, 1)
TIMEOUT = 0.01  # simulated seconds; a message costs ~20 us, a device call ~100 us


def sim_pool(tp: int = 2, pp: int = 1, *, faults: list[Fault] | None = None,
             device_faults: dict | None = None, pp_rank: int = -1, prealloc: bool = False,
             min_reserved: int = 0, max_reserved: int = 0, defer_release: bool = False,
             commit_attempts: int = 2, cluster_cls: type[SimCluster] = SimCluster, **kw: Any):
    """(cluster, fan-out space, pool): every free unmaps at once unless ``max_reserved``."""
    cluster = cluster_cls(GEO, tp, pp, faults=faults or [], device_faults=device_faults, **kw)
    fan = FanOutSpace(GEO, cluster, targets_for(tp, pp, pp_rank), timeout=TIMEOUT,
                      commit_attempts=commit_attempts)
    cfg = PoolConfig(prealloc=prealloc, min_reserved_pages=min_reserved,
                     max_reserved_pages=max_reserved)
    kv = KVCacheManager(GEO, space=fan, config=cfg, events=EventLog(),
                        defer_release=defer_release)
    return cluster, fan, kv


def mapped_on(cluster: SimCluster) -> dict[WorkerId, set[int]]:
    return {t: set(s["mapped"]) for t, s in cluster.states().items()}


def assert_all_or_none(cluster: SimCluster, fan: FanOutSpace) -> None:
    """Every page is mapped on every target or on none (quarantined pages exempt), and the
    coordinator's view agrees."""
    problems = fan.inconsistencies(cluster.states())
    assert not problems, problems


def causes(kv: KVCacheManager) -> list[str]:
    return [e.cause for e in kv.events]
