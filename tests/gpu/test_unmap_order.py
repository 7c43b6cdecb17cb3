"""A committed unmap on CudaDevice issues the bare driver calls' order (on a CPU, fake driver).

With the zero page, the page allocator's unmap (committed at once) unmaps, releases and only
then maps the zero piece back: on an H200 a release right after the zero piece's set-access took
~25 us longer. A two-phase unmap (a coordinator's, committed later) keeps the zeros in place
from the unmap on.
"""

from __future__ import annotations

import pytest

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.ledger import KVCacheManager
from workbench.errors import StateConsistencyError
from workbench.gpu import driver as drv
from workbench.gpu.device import CudaDevice
from workbench.gpu.fakedriver import FakeDriver

CALLS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")


class RecordingDriver(FakeDriver):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        for name in CALLS:
            setattr(self, name, self._wrap(name, getattr(FakeDriver, name).__get__(self)))

    def _wrap(self, name, fn):
        def call(*args):
            self.log.append(name)
            return fn(*args)
        return call


def _pool(layout: Layout, zero: bool):
    fake = RecordingDriver()
    with drv.use_driver(fake):
        dev = CudaDevice(0, zero_page=zero, mem_info_ttl_s=0.0)
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, block_size=16, num_blocks=640,
                     layout=layout)
    cfg = PoolConfig(contiguous_layout=layout is Layout.CONTIGUOUS, prealloc=False,
                     min_reserved_pages=0, max_reserved_pages=0)
    kv = KVCacheManager(geo, dev, name="p", config=cfg)
    bpp = kv.geometry.page_size // kv.geometry.block_bytes
    kv.alloc(bpp - 1)
    kv.free(kv.alloc(bpp))  # the zero page makes its page-sized piece once
    return fake, dev, kv


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("zero", [False, True])
def test_a_committed_unmap_releases_before_the_zeros_return(layout, zero):
    fake, dev, kv = _pool(layout, zero)
    ids = kv.alloc(kv.geometry.page_size // kv.geometry.block_bytes)
    n = kv.geometry.maps_per_page
    fake.log.clear()
    kv.free(ids)
    want = ["cuMemUnmap"] * n + ["cuMemRelease"] * n
    if zero:
        want += ["cuMemMap", "cuMemSetAccess"] * n
    assert fake.log == want
    assert dev.zero is None or dev.zero.pieces > 0  # the range shows zeros again
    assert not dev.mappings.any_within(kv.space.base, kv.geometry.virtual_bytes) or (
        sorted(dev.mappings) == sorted(t.va for t in kv.space.targets(0)))  # page 0 alone
    kv.check_invariants()


def test_a_two_phase_unmap_keeps_the_zeros_from_the_unmap_on():
    fake, dev, kv = _pool(Layout.CONTIGUOUS, zero=True)
    kv.alloc(kv.geometry.page_size // kv.geometry.block_bytes)  # page 1, in use
    space = kv.space
    fake.log.clear()
    space.prepare_unmap(1)
    assert fake.log == ["cuMemUnmap", "cuMemMap", "cuMemSetAccess"]
    space.abort_unmap(1)  # the handles are still there: the page comes back
    assert space.is_mapped(1)
    space.prepare_unmap(1, release_next=True)
    with pytest.raises(StateConsistencyError, match="no abort"):
        space.abort_unmap(1)  # released already
    space.commit_unmap(1)
    assert 1 not in space.retained and not dev._alloc.keys() - set(space.handles[0])
