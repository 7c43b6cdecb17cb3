"""KV tensors are views over the pool's reservation: a write through block b lands in exactly
block b's bytes, in every engine shape and both layouts."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import ConfigError

pytestmark = pytest.mark.gpu
LAYOUTS = [Layout.CONTIGUOUS, Layout.PER_LAYER]


def _pool(dev, layout, **geo):
    kw = dict(num_layers=3, kv_heads=4, head_dim=64, block_size=16, num_blocks=1000)
    kw.update(geo)
    mla = kw.pop("mla", False)
    g = KVGeometry.for_model(mla=mla, layout=layout, **kw)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=False)
    return KVCacheManager(g, dev, name="t", config=cfg)


def _mapped_bytes(kvt, kv):
    """A snapshot of every mapped page's bytes (unmapped ones are the shared zero page)."""
    import torch

    return {p: torch.cat([kvt.raw[o:o + n] for o, n in kvt.page_ranges(p)]).clone()
            for p in range(kv.geometry.num_pages) if kv.space.is_mapped(p)}


def _changed_ranges(before, after, kvt):
    """Byte ranges (relative to the base) whose contents changed."""
    import torch

    out = []
    for p, old in before.items():
        new = after[p]
        idx = torch.nonzero(old != new).flatten().tolist()
        if not idx:
            continue
        pos, starts = 0, []
        for o, n in kvt.page_ranges(p):
            starts.append((pos, o, n))
            pos += n
        for i in idx:
            for s, o, n in starts:
                if s <= i < s + n:
                    out.append(o + i - s)
    return out


def test_from_pointer_is_a_view(cuda_dev, torch_mod):
    from workbench.gpu.tensors import from_pointer

    torch = torch_mod
    g = cuda_dev.granularity
    va = cuda_dev.reserve(2 * g)
    h = cuda_dev.create(g)
    cuda_dev.map(va, g, h)
    cuda_dev.set_access(va, g)
    t = from_pointer(va, g)
    assert t.is_cuda and t.data_ptr() == va and t.numel() == g
    t.fill_(7)
    torch.cuda.synchronize()
    assert cuda_dev.read(va + 100, 4) == b"\x07" * 4  # the same bytes, seen by the driver
    del t
    cuda_dev.unmap(va, g)
    cuda_dev.release(h)
    cuda_dev.unreserve(va, 2 * g)


def test_device_tensor_is_the_view_source(cuda_dev, torch_mod):
    """CudaDevice.tensor is what workbench.tensors lays every view over: the reservation itself."""
    from workbench.errors import DeviceError

    torch = torch_mod
    g = cuda_dev.granularity
    va = cuda_dev.reserve(2 * g)
    t = cuda_dev.tensor(va, 2 * g)
    assert t.is_cuda and t.dtype == torch.uint8 and t.data_ptr() == va and t.numel() == 2 * g
    assert cuda_dev.tensor(va, g, torch.bfloat16).numel() == g // 2
    with pytest.raises(DeviceError, match="outside every reservation"):
        cuda_dev.tensor(va + g, 2 * g)
    del t
    cuda_dev.unreserve(va, 2 * g)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_vllm_write_through_block_lands_in_that_block(cuda_dev, torch_mod, layout):
    from workbench.gpu.tensors import KVTensors

    torch = torch_mod
    kv = _pool(cuda_dev, layout)
    kvt = KVTensors(kv.space, torch.bfloat16)
    caches = kvt.vllm_caches()
    g = kv.geometry
    assert caches[0].shape == (2, g.num_blocks, g.block_size, g.kv_heads, g.head_dim)
    ids = kv.alloc(150)
    assert ids is not None
    for p in range(g.num_pages):  # fill mapped pages with noise (never write the zero page)
        if kv.space.is_mapped(p):
            for o, n in kvt.page_ranges(p):
                kvt.raw[o:o + n].random_(0, 256)
    gen = torch.Generator().manual_seed(0)
    for layer, buf, b in [(0, 0, ids[0]), (2, 1, ids[-1]), (1, 1, ids[70]), (1, 0, 0)]:
        before = _mapped_bytes(kvt, kv)
        val = torch.randn(g.block_size, g.kv_heads, g.head_dim, generator=gen) + 3.0
        caches[layer][buf, b] = val.to("cuda", torch.bfloat16)
        torch.cuda.synchronize()
        after = _mapped_bytes(kvt, kv)
        changed = _changed_ranges(before, after, kvt)
        start = kv.space.block_address(layer, buf, b) - kv.space.base
        assert changed and min(changed) >= start and max(changed) < start + g.block_bytes
        raw = cuda_dev.read(kv.space.block_address(layer, buf, b), g.block_bytes)
        assert raw == val.to(torch.bfloat16).view(torch.uint8).flatten().numpy().tobytes()
        # the per-block K tensor view sees the same values
        assert torch.equal(kvt.block_tensor(layer, buf)[b].cpu(), val.to(torch.bfloat16))
    del caches, kvt
    kv.close()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_unmapped_blocks_read_zeros(cuda_dev, torch_mod, layout):
    from workbench.gpu.tensors import KVTensors

    kv = _pool(cuda_dev, layout)
    kvt = KVTensors(kv.space, "bf16")
    last = kv.geometry.num_blocks - 1
    assert not kv.space.is_mapped(kv.geometry.block_page(last))
    assert float(kvt.vllm_layer(2)[1, last].abs().sum()) == 0.0
    del kvt
    kv.close()


def test_sglang_per_layer_slots(cuda_dev, torch_mod):
    from workbench.gpu.tensors import KVTensors

    torch = torch_mod
    kv = _pool(cuda_dev, Layout.PER_LAYER)
    g = kv.geometry
    kvt = KVTensors(kv.space, torch.float16)
    k_buf, v_buf = kvt.sglang_buffers()
    assert len(k_buf) == g.num_layers and k_buf[0].shape == (g.num_slots, g.kv_heads, g.head_dim)
    ids = kv.alloc(4)
    slot = ids[2] * g.block_size + 5
    block = kvt.block_tensor(1, 1)[ids[2]]
    neighbour = block[4].clone()
    v_buf[1][slot] = 2.5
    torch.cuda.synchronize()
    assert torch.all(block[5] == 2.5) and torch.equal(block[4], neighbour)
    addr = kv.space.block_address(1, 1, ids[2]) + 5 * g.token_bytes
    assert cuda_dev.read(addr, 2) == torch.tensor([2.5], dtype=torch.float16).view(
        torch.uint8).numpy().tobytes()
    with pytest.raises(ConfigError):
        KVTensors(_pool(cuda_dev, Layout.CONTIGUOUS).space, "fp16").sglang_buffers()
    del kvt, k_buf, v_buf, block
    kv.close()


def test_sglang_contiguous_page_size_one(cuda_dev, torch_mod):
    from workbench.gpu.tensors import KVTensors

    torch = torch_mod
    kv = _pool(cuda_dev, Layout.CONTIGUOUS, block_size=1, num_blocks=3000)
    g = kv.geometry
    kvt = KVTensors(kv.space, torch.bfloat16)
    k_buf, _ = kvt.sglang_buffers()
    ids = kv.alloc(10)
    k_buf[2][ids[3]] = 1.0
    torch.cuda.synchronize()
    addr = kv.space.block_address(2, 0, ids[3])
    assert cuda_dev.read(addr, g.token_bytes) == torch.ones(
        g.kv_heads * g.head_dim, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    del kvt, k_buf
    kv.close()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_mla_latent_buffer(cuda_dev, torch_mod, layout):
    from workbench.gpu.tensors import KVTensors

    torch = torch_mod
    kv = _pool(cuda_dev, layout, mla=True, head_dim=576, num_blocks=400)
    g = kv.geometry
    kvt = KVTensors(kv.space, torch.bfloat16)
    caches = kvt.mla_caches()
    assert caches[0].shape == (g.num_blocks, g.block_size, 1, 576)
    ids = kv.alloc(3)
    others = caches[1][ids[0]].clone(), caches[0][ids[1]].clone()
    caches[1][ids[1]] = -1.0
    torch.cuda.synchronize()
    addr = kv.space.block_address(1, 0, ids[1])
    assert cuda_dev.read(addr, 4) == torch.full((2,), -1.0, dtype=torch.bfloat16).view(
        torch.uint8).numpy().tobytes()
    assert torch.equal(caches[1][ids[0]], others[0]) and torch.equal(caches[0][ids[1]], others[1])
    with pytest.raises(ConfigError):
        kvt.vllm_layer(0)
    del kvt, caches
    kv.close()
