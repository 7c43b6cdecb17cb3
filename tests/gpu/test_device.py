"""CudaDevice: the device interface on real CUDA VMM, with the simulated device's refusals."""

from __future__ import annotations

import pytest

from workbench.core.device import Device
from workbench.errors import DeviceError
from workbench.units import align_up

pytestmark = pytest.mark.gpu


def test_protocol_and_granularity(cuda_dev):
    assert isinstance(cuda_dev, Device)
    g = cuda_dev.granularity
    assert g > 0 and g % (64 << 10) == 0
    free, total = cuda_dev.mem_info()
    assert 0 < free <= total


def test_lifecycle_moves_device_memory(cuda_dev):
    dev, g = cuda_dev, cuda_dev.granularity
    va = dev.reserve(8 * g)
    free0, zero0 = dev.mem_info().free, dev.zero.held_bytes
    h = dev.create(4 * g)
    assert dev.mem_info().free <= free0 - 4 * g  # device-wide, so only an upper bound
    dev.map(va + 2 * g, 4 * g, h)
    dev.set_access(va + 2 * g, 4 * g)
    dev.unmap(va + 2 * g, 4 * g)
    dev.release(h)
    dev.unreserve(va, 8 * g)
    zero_grew = dev.zero.held_bytes - zero0  # a zero handle the size of the unmapped range
    assert zero_grew == 4 * g
    assert abs(dev.mem_info().free + zero_grew - free0) < 2 * g
    assert dev.busy_s > 0 and dev.now() > 0


def test_refusals_match_the_sim_device(cuda_dev):
    dev, g = cuda_dev, cuda_dev.granularity
    va = dev.reserve(4 * g)
    h = dev.create(g)
    with pytest.raises(DeviceError):
        dev.create(g + 1)  # not a multiple of the granularity
    with pytest.raises(DeviceError):
        dev.map(va, 2 * g, h)  # size differs from the allocation
    with pytest.raises(DeviceError):
        dev.map(va + 8 * g, g, h)  # outside the reservation
    with pytest.raises(DeviceError):
        dev.set_access(va, g)  # nothing mapped there
    with pytest.raises(DeviceError):
        dev.unmap(va, g)  # nothing mapped there
    dev.map(va, g, h)
    h2 = dev.create(g)
    with pytest.raises(DeviceError):
        dev.map(va, g, h2)  # already mapped
    with pytest.raises(DeviceError):
        dev.release(h)  # still mapped
    with pytest.raises(DeviceError):
        dev.unreserve(va, 4 * g)  # still has mappings
    with pytest.raises(DeviceError):
        dev.release(123456789)  # unknown handle
    dev.unmap(va, g)
    dev.release(h)
    dev.release(h2)
    dev.unreserve(va, 4 * g)


def test_driver_errors_are_typed_not_fatal(cuda_dev):
    free, total = cuda_dev.mem_info()
    g = cuda_dev.granularity
    with pytest.raises(DeviceError) as err:
        cuda_dev.create(align_up(4 * total, g))  # four devices' worth
    assert err.value.op == "create" and err.value.code
    cuda_dev.create(g)  # the context is still fine


def test_zero_page_backs_unmapped_ranges(cuda_dev):
    dev, g = cuda_dev, cuda_dev.granularity
    va = dev.reserve(4 * g)
    assert dev.zero_access in ("read", "readwrite")
    assert dev.read(va + g, 4096) == bytes(4096)  # unbacked reads are zeros, not a fault
    h = dev.create(g)
    dev.map(va + g, g, h)
    dev.set_access(va + g, g)
    pytest.importorskip("cuda.bindings.driver")
    from workbench.gpu.driver import call, driver

    cu = driver()
    call("cuMemsetD8", cu.cuMemsetD8, va + g, 0xAB, g)
    dev.synchronize()
    assert dev.read(va + g, 16) == b"\xab" * 16
    assert dev.read(va, 16) == bytes(16) and dev.read(va + 2 * g, 16) == bytes(16)
    dev.unmap(va + g, g)
    assert dev.read(va + g, 16) == bytes(16)  # the zero page is back
    dev.map(va + g, g, h)  # and swaps out again over the same bytes
    dev.set_access(va + g, g)
    assert dev.read(va + g, 16) == b"\xab" * 16
    dev.unmap(va + g, g)
    dev.release(h)
    dev.unreserve(va, 4 * g)


def test_without_zero_page(cuda_dev):
    from workbench.gpu.device import CudaDevice

    dev = CudaDevice(0, zero_page=False)
    try:
        g = dev.granularity
        va = dev.reserve(2 * g)
        h = dev.create(g)
        dev.map(va, g, h)
        dev.set_access(va, g)
        assert dev.zero_access is None
        dev.unmap(va, g)
        dev.release(h)
        dev.unreserve(va, 2 * g)
    finally:
        dev.close()


def test_close_gives_everything_back(cuda_dev):
    from workbench.gpu.device import CudaDevice

    free0 = cuda_dev.mem_info().free
    dev = CudaDevice(0)
    g = dev.granularity
    va = dev.reserve(16 * g)
    for i in range(4):
        h = dev.create(g)
        dev.map(va + i * g, g, h)
        dev.set_access(va + i * g, g)
    dev.create(2 * g)
    dev.close()
    assert cuda_dev.mem_info().free == free0


def test_make_device_ignores_sim_knobs():
    pytest.importorskip("cuda.bindings.driver")
    from workbench.backends import BackendUnavailable, make_device

    try:
        dev = make_device("gpu", preset="h200", capacity=1 << 30, env=None)
    except BackendUnavailable as err:
        pytest.skip(f"no usable CUDA device: {err}")
    assert dev.granularity > 0 and dev.index == 0
    dev.close()


def test_cuda_n_names_the_gpu_and_bad_indices_are_refused():
    pytest.importorskip("cuda.bindings.driver")
    from workbench.backends import BackendUnavailable, cuda_device_count, make_device, probe

    n = cuda_device_count()
    if n == 0:
        pytest.skip("no CUDA GPU is visible")
    dev = make_device(f"cuda:{n - 1}", zero_page=False)
    assert dev.index == n - 1 and dev.name.startswith(f"cuda:{n - 1} ")
    dev.close()
    assert probe(f"cuda:{n}") == (False, f"backend 'cuda:{n}': this host shows {n} CUDA GPU(s), "
                                         f"cuda:0 to cuda:{n - 1}. Fix: pick one of those, or "
                                         'use backend="sim"')
    with pytest.raises(BackendUnavailable, match="shows"):
        make_device(f"cuda:{n}")


def _tiles(dev, va, size) -> bool:
    """Zero pieces and mappings cover ``[va, va+size)`` exactly, without overlap."""
    spans = [(s, n) for s, n in dev.zero._size.items() if va <= s < va + size]
    spans += [(s, n) for s, (n, _) in dev.mappings.items() if va <= s < va + size]
    pos = va
    for s, n in sorted(spans):
        if s != pos:
            return False
        pos = s + n
    return pos == va + size


def test_zero_pieces_split_and_settle(cuda_dev):
    """Maps take the zero pieces under them off; unmaps put target-sized pieces back (or chunks
    above zero_max_exact); the pieces and mappings always tile the reservation."""
    import random

    from workbench.gpu.device import CudaDevice

    dev = CudaDevice(0, zero_max_exact=2 * cuda_dev.granularity)
    try:
        g = dev.granularity
        va = dev.reserve(32 * g)
        assert dev.zero.pieces == 32 and _tiles(dev, va, 32 * g)
        rng = random.Random(0)
        live: dict[int, tuple[int, int]] = {}
        for _ in range(60):
            if live and rng.random() < 0.45:
                at, (n, h) = live.popitem()
                dev.unmap(va + at * g, n * g)
                dev.release(h)
            else:
                n = rng.choice((1, 1, 2, 3))
                at = rng.randrange(0, 32 - n + 1)
                if any(a < at + n and at < a + m for a, (m, _) in live.items()):
                    continue
                h = dev.create(n * g)
                dev.map(va + at * g, n * g, h)
                dev.set_access(va + at * g, n * g)
                live[at] = (n, h)
            assert _tiles(dev, va, 32 * g)
        for at in range(32):  # every unbacked chunk reads zeros
            if not any(a <= at < a + m for a, (m, _) in live.items()):
                assert dev.read(va + at * g + 12345, 8) == bytes(8)
        for at, (n, h) in live.items():
            dev.unmap(va + at * g, n * g)
            dev.release(h)
        dev.unreserve(va, 32 * g)
        assert dev.zero.pieces == 0 and set(dev.zero.handles) <= {g, 2 * g}
    finally:
        dev.close()
