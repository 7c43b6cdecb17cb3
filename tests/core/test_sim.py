"""The simulated GPU: driver-like refusals, latency presets, background prealloc, import hygiene."""

from __future__ import annotations

import subprocess
import sys

import pytest
import simpy

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError, DeviceError
from workbench.sim.device import MiB, SimDevice
from workbench.sim.prealloc import PreallocProcess


def test_device_refuses_what_a_driver_refuses():
    d = SimDevice(capacity=8 * MiB)
    va = d.reserve(8 * MiB)
    h = d.create(2 * MiB)
    d.map(va, 2 * MiB, h)
    with pytest.raises(DeviceError, match="already mapped"):
        d.map(va, 2 * MiB, h)
    with pytest.raises(DeviceError, match="still mapped"):
        d.release(h)
    with pytest.raises(DeviceError, match="outside"):
        d.map(va + 8 * MiB, 2 * MiB, d.create(2 * MiB))
    with pytest.raises(DeviceError, match="out of memory"):
        d.create(8 * MiB)
    d.unmap(va, 2 * MiB)
    with pytest.raises(DeviceError, match="not mapped"):
        d.unmap(va, 2 * MiB)
    d.release(h)
    with pytest.raises(ConfigError, match="unknown"):
        SimDevice("tpu")


def test_presets_price_calls():
    h200, a100 = SimDevice("h200"), SimDevice("a100")
    for d in (h200, a100):
        d.create(2 * MiB)
    assert a100.busy_s > 5 * h200.busy_s  # cuMemCreate: 193 us vs 20 us


def test_weights_lower_every_pools_headroom():
    d = SimDevice(capacity=64 * MiB)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640)
    cfg = PoolConfig(min_reserved_pages=0, max_reserved_pages=0, gpu_utilization=1.0)
    a = KVCacheManager(geo, d, name="a", config=cfg)
    b = KVCacheManager(geo, d, name="b", config=cfg)
    before = b.available_size()
    assert a.alloc(300) is not None
    assert b.available_size() < before  # a's growth is b's loss
    d.occupy("weights", d.mem_info().free)
    assert b.alloc(64) is None


def test_background_prealloc_moves_map_cost_off_the_request():
    env = simpy.Environment()
    d = SimDevice("a100", env=env)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=6400)
    kv = KVCacheManager(geo, d, name="a", config=PoolConfig(min_reserved_pages=3,
                                                            max_reserved_pages=6))
    proc = PreallocProcess(env, kv)
    costs = []

    def requests():
        for _ in range(6):
            before = d.busy_s
            kv.alloc(64)  # one page each
            costs.append(d.busy_s - before)
            yield env.timeout(0.01)

    env.process(requests())
    env.run(until=1)
    assert costs and max(costs) == 0.0  # every request found a reserved page
    assert proc.pages_mapped >= 6
    assert len(kv.pages.reserved) == 3
    kv.check_invariants()


def test_sim_and_core_never_import_torch_or_cuda():
    code = ("import sys, workbench.sim.device, workbench.core.ledger, workbench.core.replay, "
            "workbench.cli, workbench.backends; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
