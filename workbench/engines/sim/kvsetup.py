"""How an engine instance gets its KV memory: a **static** split or an **elastic** pool.

* ``static`` (the engine's native mode, vLLM ``gpu_memory_utilization`` per instance): KV is a
  fixed tensor allocated once at start. Modelled as a ledger on its *own* :class:`SimDevice` slice
  whose capacity is the instance's KV split and whose VMM calls cost nothing, with no reserve: the
  capacity is fixed, nothing is shared, nothing is paid at run time. Its footprint on the real GPU
  is the whole split, all the time (``held_bytes``).
* ``elastic`` (KVCacheD): a ledger whose virtual range covers everything the device could give
  it, on the one :class:`SimDevice` every instance shares; pages are mapped on demand (VMM latency
  from the device preset), parked in a 5..10-page reserve, unmapped when the reserve is full.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from workbench.config import PoolConfig
from workbench.core.events import EventLog
from workbench.core.geometry import Layout
from workbench.core.ledger import KVCacheManager
from workbench.engines.models import ModelSpec
from workbench.errors import ConfigError
from workbench.sim.device import DevicePreset, SimDevice, VMMLatency

FREE_VMM = VMMLatency(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


class InstanceKV(NamedTuple):
    kv: KVCacheManager
    mode: str
    held_bytes: int | None  # static: the split it holds on the GPU; elastic: None (= mapped)


def static_pool(model: ModelSpec, kv_bytes: int, *, name: str, block_size: int = 16,
                config: PoolConfig | None = None, env=None, blocks_first: bool = False,
                num_blocks: int | None = None) -> InstanceKV:
    """``num_blocks``: the engine sized its KV tensor in blocks (vLLM's
    ``num_gpu_blocks_override``, null block included) rather than whole page ids of
    ``kv_bytes``; its private device is rounded up to page ids, which cost nothing here."""
    shape = _shape(config, blocks_first)
    probe = model.geometry(2, block_size, **shape)
    pages = kv_bytes // probe.page_id_bytes
    if pages < 1 and num_blocks is None:
        raise ConfigError(f"static KV of {kv_bytes} bytes for {name}",
                          f"is less than one page id ({probe.page_id_bytes} bytes)",
                          "raise gpu_memory_utilization or use a smaller model")
    per_page = probe.page_size // probe.block_bytes
    geo = model.geometry(num_blocks or pages * per_page, block_size, **shape)
    cap = geo.num_pages * geo.page_id_bytes
    dev = SimDevice(DevicePreset(f"static-{name}", cap, geo.page_size, FREE_VMM), env=env,
                    name=f"{name}-static")
    cfg = replace(config or PoolConfig(), prealloc=False, min_reserved_pages=0,
                  max_reserved_pages=0, gpu_utilization=1.0)
    kv = KVCacheManager(geo, dev, name=name, config=cfg, events=EventLog(keep=False))
    held = num_blocks * probe.block_bytes * probe.num_layers * probe.num_buffers \
        if num_blocks else cap
    return InstanceKV(kv, "static", held)


def elastic_pool(model: ModelSpec, device: SimDevice, *, name: str, block_size: int = 16,
                 config: PoolConfig | None = None, virtual_bytes: int | None = None,
                 keep_events: bool = False, blocks_first: bool = False) -> InstanceKV:
    shape = _shape(config, blocks_first)
    probe = model.geometry(2, block_size, **shape)
    virt = virtual_bytes if virtual_bytes is not None else device.mem_info().free
    pages = max(1, virt // probe.page_id_bytes)
    geo = model.geometry(pages * (probe.page_size // probe.block_bytes), block_size,
                         **shape)
    kv = KVCacheManager(geo, device, name=name, config=config or PoolConfig(),
                        events=EventLog(keep=keep_events))
    return InstanceKV(kv, "elastic", None)


def _shape(config: PoolConfig | None, blocks_first: bool = False) -> dict:
    """The geometry's page size and layout follow the pool config (the ledger refuses a
    mismatch); ``blocks_first``: the engine's KV tensor keeps K and V inside each block."""
    cfg = config or PoolConfig()
    return {"page_size": cfg.page_size, "blocks_first": blocks_first,
            "layout": Layout.CONTIGUOUS if cfg.contiguous_layout else Layout.PER_LAYER}
