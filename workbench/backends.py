"""Pick a device by name: ``make_device("sim")`` on any laptop, ``make_device("gpu")`` on a CUDA
host, ``make_device("host")`` for real engines on a CPU. The core above is the same for all."""

from __future__ import annotations

from workbench.core.device import Device
from workbench.errors import ConfigError

BACKENDS = ("sim", "gpu", "host")


def make_device(backend: str = "sim", **kw) -> Device:
    if backend == "sim":
        from workbench.sim.device import SimDevice

        return SimDevice(**kw)
    if backend == "gpu":
        try:
            from workbench.gpu import make_device as make_gpu
        except ImportError as err:
            raise ConfigError("backend 'gpu'", f"cannot be loaded ({err})",
                              "run on a CUDA host with torch and cuda-python installed "
                              "(pip install 'workbench[gpu]'), or use backend='sim'") from err
        return make_gpu(**kw)
    if backend == "host":
        from workbench.host.device import HostDevice

        return HostDevice(**kw)
    raise ConfigError(f"backend {backend!r}", "unknown", f"use one of {', '.join(BACKENDS)}")
