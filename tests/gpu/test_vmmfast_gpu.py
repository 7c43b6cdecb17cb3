"""The C fast path on a CUDA GPU: on by default, and the same effect as the Python batch."""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import DeviceError
from workbench.gpu import fastcalls

from .conftest import require_cuda
from .scenario import run_sizes

pytestmark = pytest.mark.gpu
SCENARIO = [64, 64, -1, 128, -1, -1, 100, 30, -1, -1, 64, -1] * 2


def _devices(zero: bool):
    from workbench.gpu.device import CudaDevice

    require_cuda().close()
    if not fastcalls.LIBRARY.exists():
        pytest.skip("the C fast path is not built (make vmmfast: no C compiler?)")
    return (CudaDevice(0, zero_page=zero, mem_info_ttl_s=0.0),
            CudaDevice(0, zero_page=zero, mem_info_ttl_s=0.0, fast_path=False))


def _outcome(dev, layout: Layout) -> dict:
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=layout)
    kv = KVCacheManager(geo, dev, name="p", config=PoolConfig(
        contiguous_layout=layout is Layout.CONTIGUOUS, min_reserved_pages=0,
        max_reserved_pages=1))
    base = kv.space.base
    outcome, live = run_sizes(kv, SCENARIO)
    res = {"outcome": outcome, "events": kv.events.keys(),
           "mappings": sorted((va - base, s) for va, (s, _) in dev.mappings.items()),
           "alloc": sorted(s for _, s in dev._alloc.values()),
           "zero": sorted((va - base, s) for va, s in dev.zero._size.items())
           if dev.zero is not None else None}
    for ids in live:
        kv.free(ids)
    assert kv.close() == []
    return res


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_the_fast_path_is_on_and_does_what_the_python_batch_does(layout, zero):
    fast, slow = _devices(zero)
    try:
        assert fast.fast_path_note == f"on ({fastcalls.DRIVER_SONAME})"
        assert fast._fast is not None and slow._fast is None
        assert _outcome(fast, layout) == _outcome(slow, layout)
    finally:
        fast.close()
        slow.close()


def test_c_mapped_memory_is_usable_and_its_handles_serve_every_call():
    fast, slow = _devices(zero=True)
    slow.close()
    try:
        dev, g = fast, fast.granularity
        cu = dev._cu
        va = dev.reserve(4 * g)
        h1, h2 = dev.map_targets([(va, g), (va + g, g)])
        assert cu.cuMemsetD8(va, 7, 2 * g)[0] == 0
        assert dev.read(va, 2 * g) == b"\7" * (2 * g)  # mapped and writable
        assert dev.unmap_release([(va + g, g)], [h2]) is None
        assert dev.read(va + g, g) == bytes(g)  # the zero page is back
        dev.unmap(va, g)  # the per-call path on a handle the C call made
        dev.map(va + 2 * g, g, h1)
        dev.set_access(va + 2 * g, g)
        dev.unmap(va + 2 * g, g)
        dev.release(h1)
        assert not dev._alloc and not dev.mappings
    finally:
        fast.close()


def test_a_driver_failure_in_c_raises_the_python_paths_error():
    from workbench.gpu.device import CudaDevice

    errors = []
    for fast_path in (True, False):
        require_cuda().close()
        dev = CudaDevice(0, zero_page=False, fast_path=fast_path)
        try:
            big = 1 << 40  # more than any GPU's memory: the driver refuses the create
            va = dev.reserve(2 * big)
            with pytest.raises(DeviceError) as err:
                dev.map_targets([(va, dev.granularity), (va + big, big)])
            created, mapped = err.value.partial
            errors.append((str(err.value), len(created), mapped, len(dev.mappings)))
            assert dev.unmap_release([(va, dev.granularity)], created) is None
        finally:
            dev.close()
    assert errors[0] == errors[1]
    assert errors[0][0].startswith("create failed: ") and errors[0][1:] == (1, 1, 1)
