"""The CUDA side of the KV tensor views: a torch tensor over a raw device pointer, no copy.

One uint8 tensor spans a reservation, built from the raw device pointer through
``__cuda_array_interface__``; :class:`CudaDevice.tensor <workbench.gpu.device.CudaDevice.tensor>`
hands it to :mod:`workbench.tensors`, the one implementation of the engines' shapes (vLLM, SGLang,
MLA) for host and CUDA memory alike. Its names are re-exported here for the GPU callers.
"""

from __future__ import annotations

import torch

from workbench.core.geometry import Layout
from workbench.errors import DeviceError
from workbench.tensors import DTYPES, KVTensors, kv_tensors


class _DevicePointer:
    """The minimal ``__cuda_array_interface__`` (v3) exporter for a raw byte range."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "strides": None,
            "version": 3, "stream": None,  # no stream: nothing to synchronize with
        }


def from_pointer(ptr: int, nbytes: int, device_index: int = 0) -> torch.Tensor:
    """A uint8 CUDA tensor over ``[ptr, ptr+nbytes)``, sharing the memory (never a copy)."""
    with torch.cuda.device(device_index):
        t = torch.as_tensor(_DevicePointer(ptr, nbytes), device=f"cuda:{device_index}")
    if t.data_ptr() != ptr or t.numel() != nbytes:
        raise DeviceError("view", f"torch copied the range at {ptr:#x} instead of viewing it "
                                  "(this torch cannot wrap a device pointer); use a CUDA build "
                                  "of torch that reads __cuda_array_interface__ v3")
    return t


__all__ = ["DTYPES", "KVTensors", "Layout", "from_pointer", "kv_tensors"]
