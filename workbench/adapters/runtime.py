"""What every engine adapter shares: the process's device per engine device string, and config.

One device object per physical device per process, shared by every pool on it (as a GPU is),
built by :mod:`workbench.backends`: the engine's ``"cpu"`` is the host device. CUDA devices are
refused here until the adapters' GPU path is tested (a later issue).
"""

from __future__ import annotations

import itertools
from typing import Any

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.device import Device
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError

_devices: dict[str, Device] = {}
_ids = itertools.count()
ledgers: list[KVCacheManager] = []  # every pool this process built (doctor, tests)


def device_for(engine_device: Any) -> Device:
    key = str(engine_device)
    if key not in _devices:
        if key.split(":")[0] != "cpu":
            raise ConfigError(f"KV device {key!r}", "the workbench adapters have only the host "
                              "device (CPU) so far", "run the engine on CPU, or unset "
                              "WORKBENCH_KV_AUTOPATCH to use the engine's own allocator")
        _devices[key] = make_device("host")
    return _devices[key]


def pool_config(**overrides) -> PoolConfig:
    return PoolConfig.from_env(**overrides)


def make_ledger(geometry: KVGeometry, device: Device, prefix: str,
                config: PoolConfig) -> KVCacheManager:
    kv = KVCacheManager(geometry, device, name=f"{prefix}-{next(_ids)}", config=config)
    ledgers.append(kv)
    return kv
