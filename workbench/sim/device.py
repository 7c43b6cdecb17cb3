"""A simulated GPU: one device's physical memory shared by every pool on it, with VMM latencies.

Each call charges its preset latency *per call*, whatever its size (the driver's cost barely grows
with the bytes one call covers), so a per-layer page id of 64 maps costs 64 times a compound one.
The device keeps a real mapping table and refuses what a driver refuses (map over a mapping, unmap
of nothing, release of an unknown handle), so a core bug shows up here as it would on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from workbench.core.device import DriverRefusals, MemInfo
from workbench.errors import ConfigError, DeviceError
from workbench.hardware import GPU_PRESETS, Provenance, VMMLatency
from workbench.units import MiB

_mem_info = partial(tuple.__new__, MemInfo)


@dataclass(frozen=True, slots=True)
class DevicePreset:
    name: str
    capacity: int
    granularity: int
    latency: VMMLatency
    provenance: Provenance | None = None  # None: made up here (tests, a static control pool)


# One per GPU in workbench.hardware, which says which latencies were measured and where.
PRESETS = {k: DevicePreset(k, g.memory_bytes, g.granularity, g.vmm, g.provenance)
           for k, g in GPU_PRESETS.items()}


class SimDevice(DriverRefusals):
    """One simulated GPU. Pass a SimPy ``env`` to tie its clock to simulated time; without one the
    clock is the device's own busy time (handy for replay and unit tests)."""

    def __init__(self, preset: str | DevicePreset = "h200", *, env=None,
                 capacity: int | None = None, name: str | None = None):
        if isinstance(preset, str):
            if preset not in PRESETS:
                raise ConfigError(f"device preset {preset!r}", "unknown",
                                  f"use one of {', '.join(PRESETS)}")
            preset = PRESETS[preset]
        self.preset = preset
        self.name = name or f"sim-{preset.name}"
        self.granularity = preset.granularity
        self.capacity = capacity if capacity is not None else preset.capacity
        self.env = env
        self._cost = preset.latency  # seconds per call, by call name
        self._busy = 0.0
        self._next_va = 1 << 40
        self._next_handle = 1
        self._init_tables()  # reservations: va -> size; mappings: va -> (size, handle)
        self.allocations: dict[int, int] = {}  # handle -> size
        self._allocated = 0  # sum of allocations, kept so mem_info() is O(1)
        self.occupied: dict[str, int] = {}  # owner -> bytes held outside any pool (weights...)

    # -- time --------------------------------------------------------------------------------
    @property
    def busy_s(self) -> float:
        return self._busy

    def now(self) -> float:
        """Simulated time: the SimPy clock when there is one, else the device's own busy time."""
        return self.env.now if self.env is not None else self._busy


    # -- memory outside the pools ------------------------------------------------------------
    def occupy(self, owner: str, nbytes: int) -> None:
        """Hold ``nbytes`` for ``owner`` (weights, activations): lowers every pool's headroom."""
        if nbytes < 0 or nbytes > self.mem_info().free + self.occupied.get(owner, 0):
            raise ConfigError(f"occupy {nbytes} bytes for {owner}",
                              f"only {self.mem_info().free} bytes are free",
                              "use a bigger device or a smaller model")
        self.occupied[owner] = nbytes

    # -- Device ------------------------------------------------------------------------------
    def mem_info(self) -> MemInfo:
        # the core asks before every new page: build the NamedTuple without its Python __new__
        return _mem_info((self._free_bytes(), self.capacity))

    def _free_bytes(self) -> int:
        return self.capacity - self._allocated - sum(self.occupied.values())

    def reserve(self, size: int) -> int:
        self._refuse_size("reserve", size)
        self._busy += self._cost.reserve
        va = self._next_va
        self._next_va += size + self.granularity  # a guard gap between reservations
        self.reservations[va] = size
        return va

    def unreserve(self, va: int, size: int) -> None:
        self._refuse_unreserve(va, size)
        del self.reservations[va]

    def create(self, size: int) -> int:
        self._refuse_size("create", size)
        if size > self._free_bytes():
            raise DeviceError("create", "out of memory", "CUDA_ERROR_OUT_OF_MEMORY")
        self._busy += self._cost.create
        h = self._next_handle
        self._next_handle += 1
        self.allocations[h] = size
        self._allocated += size
        return h

    def map(self, va: int, size: int, handle: int) -> None:
        self._refuse_map(va, size, handle, self.allocations.get(handle))
        self._busy += self._cost.map
        self.mappings[va] = (size, handle)

    def set_access(self, va: int, size: int) -> None:
        self._refuse_unmapped("set_access", va, size)
        self._busy += self._cost.set_access

    def unmap(self, va: int, size: int) -> None:
        self._refuse_unmapped("unmap", va, size)
        self._busy += self._cost.unmap
        del self.mappings[va]

    def release(self, handle: int) -> None:
        self._refuse_release(handle, handle in self.allocations)
        self._busy += self._cost.release
        self._allocated -= self.allocations.pop(handle)


__all__ = ["PRESETS", "DevicePreset", "MiB", "SimDevice", "VMMLatency"]
