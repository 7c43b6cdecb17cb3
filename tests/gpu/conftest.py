"""GPU tests: skipped cleanly where cuda-python, torch or a CUDA device is absent (CI)."""

from __future__ import annotations

import pytest


def require_cuda():
    """Skip unless cuda-python can open a device that supports virtual memory management."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    from workbench.errors import DeviceError
    from workbench.gpu.device import CudaDevice

    try:
        return CudaDevice(0, mem_info_ttl_s=0.0)
    except DeviceError as err:
        pytest.skip(f"no usable CUDA device: {err}")


def require_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.fixture
def cuda_dev():
    """A fresh CudaDevice (exact mem_info); everything it still holds is given back after."""
    dev = require_cuda()
    yield dev
    dev.close()


@pytest.fixture
def torch_mod():
    return require_torch()
