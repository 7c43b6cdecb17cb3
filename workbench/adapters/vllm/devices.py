"""The device a vLLM worker's KV pool lives on: the host for ``cpu``, one per-process
:class:`~workbench.gpu.device.CudaDevice` per GPU for ``cuda``/``cuda:N``.

Kept here (not in ``adapters/runtime.py``, which refuses CUDA until every adapter's GPU path is
tested) so the vLLM path can open CUDA on its own. Two things differ from the library default:

* **the unbacked range is safe to write.** vLLM's warm-up and CUDA-graph capture run the model on
  dummy batches whose slot mappings may point at blocks no request holds; the library's zero page
  is mapped read-only (a write faults, which kills the engine), so the vLLM device maps it
  read-write: such writes land in the shared zero piece and are never read as a request's KV.
  ``WORKBENCH_KV_VLLM_ZERO_RW=0`` keeps it read-only (for tests that want the fault).
* one device per GPU index per process, shared by every pool on it, as the GPU is.
"""

from __future__ import annotations

import os
from typing import Any

from workbench.adapters import runtime
from workbench.backends import make_device
from workbench.core.device import Device

_cuda: dict[int, Device] = {}


def cuda_index(engine_device: Any) -> int | None:
    """The GPU index of a torch device or name (``cuda`` is the current device); None if not
    CUDA."""
    text = str(engine_device)
    kind, _, idx = text.partition(":")
    if kind != "cuda":
        return None
    if idx:
        return int(idx)
    index = getattr(engine_device, "index", None)
    if index is not None:
        return int(index)
    import torch

    return int(torch.cuda.current_device())


def make_zero_writable(dev: Any) -> None:
    """Have the device's zero page mapped read-write from its first fill on (before any
    reservation is made, so every unbacked byte of every pool takes writes)."""
    zero = getattr(dev, "zero", None)
    if zero is not None and zero.access is None:
        zero._desc = zero._rw
        zero.access = "readwrite"


def device_for(engine_device: Any) -> Device:
    index = cuda_index(engine_device)
    if index is None:
        return runtime.device_for(engine_device)
    if index not in _cuda:
        dev = make_device(f"cuda:{index}")
        if os.environ.get("WORKBENCH_KV_VLLM_ZERO_RW", "1") != "0":
            make_zero_writable(dev)
        _cuda[index] = dev
    return _cuda[index]
