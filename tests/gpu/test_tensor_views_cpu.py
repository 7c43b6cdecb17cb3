"""The tensor views' arithmetic, checked on the CPU: a CPU byte tensor stands in for the
reservation, so this runs wherever torch is installed (no GPU needed)."""

from __future__ import annotations

import pytest

from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.errors import ConfigError
from workbench.sim.device import PRESETS, DevicePreset, SimDevice

torch = pytest.importorskip("torch")


def _views(monkeypatch, layout, mla, block_size):
    import workbench.gpu.tensors as T

    monkeypatch.setattr(T, "from_pointer", lambda ptr, n, idx=0: torch.zeros(n, dtype=torch.uint8))
    geo = KVGeometry.for_model(num_layers=3, kv_heads=4, head_dim=576 if mla else 64, mla=mla,
                               block_size=block_size, num_blocks=600,
                               layout=layout, page_size=64 << 10)
    small = DevicePreset("small-pages", 1 << 30, 64 << 10, PRESETS["h200"].latency)
    space = KVSpace(geo, SimDevice(small))  # 64 KiB pages keep the stand-in range small
    return T.KVTensors(space, torch.bfloat16), space, geo


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_a_block_write_lands_in_exactly_that_block(monkeypatch, layout, mla, block_size):
    kvt, space, geo = _views(monkeypatch, layout, mla, block_size)
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
