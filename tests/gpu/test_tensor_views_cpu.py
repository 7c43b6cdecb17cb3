"""The tensor views' arithmetic, checked on the CPU: a CPU byte tensor stands in for the
reservation, so this runs wherever torch is installed (no GPU needed). The views are the one
implementation in :mod:`workbench.tensors` that CUDA and host memory share."""

from __future__ import annotations

import pytest

from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError
from workbench.sim.device import PRESETS, DevicePreset, SimDevice

torch = pytest.importorskip("torch")


class _StandIn(SimDevice):
    """A simulated device that hands out CPU bytes where a CUDA device hands out its memory."""

    def tensor(self, va, nbytes, dtype=None):
        return torch.zeros(nbytes, dtype=dtype or torch.uint8)


def _views(layout, mla, block_size):
    from workbench.gpu.tensors import KVTensors  # the GPU callers' import path still works

    geo = KVGeometry.for_model(num_layers=3, kv_heads=4, head_dim=576 if mla else 64, mla=mla,
                               block_size=block_size, num_blocks=600,
                               layout=layout, page_size=64 << 10)
    small = DevicePreset("small-pages", 1 << 30, 64 << 10, PRESETS["h200"].latency)
    space = KVSpace(geo, _StandIn(small))  # 64 KiB pages keep the stand-in range small
    return KVTensors(space, torch.bfloat16), space, geo


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_a_block_write_lands_in_exactly_that_block(layout, mla, block_size):
    kvt, space, geo = _views(layout, mla, block_size)
    for layer in range(geo.num_layers):
        for buf in range(geo.num_buffers):
            for b in (0, 5, geo.num_blocks - 1):
                kvt.raw.zero_()
                if mla:
                    kvt.mla_layer(layer)[b] = 1
                else:
                    kvt.vllm_layer(layer)[buf, b] = 1
                nz = torch.nonzero(kvt.raw).flatten()
                start = space.block_address(layer, buf, b) - space.base
                assert (int(nz.min()), int(nz.max()), len(nz)) == (
                    start, start + geo.block_bytes - 1, geo.block_bytes)
                if mla:
                    continue
                if layout is Layout.CONTIGUOUS and block_size > 1:
                    with pytest.raises(ConfigError):
                        kvt.sglang_buffer(layer, buf)
                    continue
                kvt.raw.zero_()
                kvt.sglang_buffer(layer, buf)[b * block_size + block_size - 1] = 1
                nz = torch.nonzero(kvt.raw).flatten()
                slot = start + (block_size - 1) * geo.token_bytes
                assert (int(nz.min()), int(nz.max())) == (slot, slot + geo.token_bytes - 1)


def test_views_refuse_what_they_cannot_lay_out():
    kvt, space, geo = _views(Layout.CONTIGUOUS, False, 16)
    from workbench.tensors import KVTensors

    with pytest.raises(ConfigError, match="the pool was sized for 2-byte elements"):
        KVTensors(space, torch.float32)
    with pytest.raises(ConfigError, match="is not a KV dtype name"):
        KVTensors(space, "bf17")
    with pytest.raises(ConfigError, match="views need"):
        KVTensors(space, raw=torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(ConfigError, match="block shape"):
        kvt.block_tensor(0, 0, (3, 5))
    assert kvt.block_tensor(0, 0, (16 * 4 * 64,)).shape == (600, 4096)
    with pytest.raises(ConfigError, match="holds no real memory"):
        KVTensors(KVSpace(geo, SimDevice(space.device.preset)))


def test_a_raw_slice_is_laid_out_from_its_own_start():
    """Views over a uint8 slice that does not start at its storage's start (a static pool)."""
    from workbench.tensors import KVTensors

    geo = KVGeometry(num_layers=2, kv_heads=2, head_dim=32, block_size=16, num_blocks=256)
    space = KVSpace(geo, SimDevice("h200"))
    backing = torch.zeros(space.size + 64, dtype=torch.uint8)
    kvt = KVTensors(space, torch.float16, raw=backing[64:])
    kvt.vllm_layer(1)[1, 3] = 1 + 2**-10  # 0x3c01: both bytes of every element non-zero
    nz = torch.nonzero(backing).flatten()
    start = 64 + space.block_address(1, 1, 3) - space.base
    assert (int(nz.min()), int(nz.max())) == (start, start + geo.block_bytes - 1)
