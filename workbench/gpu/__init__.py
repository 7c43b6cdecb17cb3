"""``backend="gpu"``: the workbench core on real CUDA virtual memory (cuda-python + torch).

Importing this package imports neither torch nor cuda-python; :func:`make_device` loads the driver
bindings, and ``workbench.gpu.tensors`` needs torch.
"""

from __future__ import annotations

from typing import Any

_SIM_ONLY = ("preset", "capacity", "env")  # sim device knobs a shared trace may carry


def make_device(**kw: Any):
    """A :class:`~workbench.gpu.device.CudaDevice` (``device_index``, ``zero_page``,
    ``mem_info_ttl_s``, ``name``); keys that only describe the simulated GPU are ignored."""
    from workbench.gpu.device import CudaDevice

    for key in _SIM_ONLY:
        kw.pop(key, None)
    return CudaDevice(**kw)


__all__ = ["make_device"]
