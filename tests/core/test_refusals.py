"""One table of driver-like refusals, fed to every device: sim and host here, CUDA on a GPU host.

Each case starts from the same state (a 4-granule reservation, handles of 1, 1 and 2 granules,
the first mapped at the reservation's second granule) and must be refused with the same message,
leaving every table unchanged. "Already mapped" is the overlap rule: a map onto any mapped byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import DeviceError
from workbench.host.device import HostDevice
from workbench.sim.device import SimDevice
from workbench.units import MiB


def _cuda():
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    from workbench.gpu.device import CudaDevice

    try:
        return CudaDevice(0, mem_info_ttl_s=0.0)
    except DeviceError as err:
        pytest.skip(f"no usable CUDA device: {err}")


DEVICES = [
    pytest.param(lambda: SimDevice("h200"), id="sim"),
    pytest.param(lambda: HostDevice(capacity=64 * MiB), id="host"),
    pytest.param(_cuda, id="cuda", marks=pytest.mark.gpu),
]


@dataclass(slots=True)
class Setup:
    dev: object
    g: int
    va: int
    h1: int  # one granule, mapped at va + g
    h2: int  # one granule, not mapped
    h3: int  # two granules, not mapped


def _setup(dev) -> Setup:
    g = dev.granularity
    va = dev.reserve(4 * g)
    h1, h2, h3 = dev.create(g), dev.create(g), dev.create(2 * g)
    dev.map(va + g, g, h1)
    dev.set_access(va + g, g)
    return Setup(dev, g, va, h1, h2, h3)


Case = Callable[[Setup], None]
CASES: list[tuple[str, Case, str]] = [
    ("reserve zero bytes", lambda s: s.dev.reserve(0), "not a positive multiple"),
    ("reserve off granularity", lambda s: s.dev.reserve(s.g + 4096), "not a positive multiple"),
    ("create off granularity", lambda s: s.dev.create(s.g // 2), "not a positive multiple"),
    ("map at a mapped start", lambda s: s.dev.map(s.va + s.g, s.g, s.h2), "already mapped"),
    ("map overlapping a mapping's head", lambda s: s.dev.map(s.va, 2 * s.g, s.h3),
     "already mapped"),
    ("map past the reservation", lambda s: s.dev.map(s.va + 4 * s.g, s.g, s.h2), "outside"),
    ("map straddling the end", lambda s: s.dev.map(s.va + 3 * s.g, 2 * s.g, s.h3), "outside"),
    ("map with a handle of another size", lambda s: s.dev.map(s.va, s.g, s.h3), "not a live"),
    ("map an unknown handle", lambda s: s.dev.map(s.va, s.g, -1), "not a live"),
    ("set access where nothing is mapped", lambda s: s.dev.set_access(s.va, s.g), "not mapped"),
    ("set access with the wrong size", lambda s: s.dev.set_access(s.va + s.g, 2 * s.g),
     "not mapped"),
    ("unmap nothing", lambda s: s.dev.unmap(s.va + 2 * s.g, s.g), "not mapped"),
    ("unmap inside a mapping", lambda s: s.dev.unmap(s.va + s.g + s.g // 2, s.g // 2),
     "not mapped"),
    ("release a mapped handle", lambda s: s.dev.release(s.h1), "still mapped"),
    ("release an unknown handle", lambda s: s.dev.release(-1), "unknown handle"),
    ("unreserve with mappings", lambda s: s.dev.unreserve(s.va, 4 * s.g), "still has mappings"),
    ("unreserve the wrong size", lambda s: s.dev.unreserve(s.va, 2 * s.g), "no reservation"),
]


def _tables(dev) -> tuple[dict, dict]:
    return dict(dev.reservations), dict(dev.mappings)


@pytest.mark.parametrize("make", DEVICES)
def test_every_device_refuses_the_same_cases(make):
    dev = make()
    try:
        for label, case, message in CASES:
            s = _setup(dev)
            before = _tables(dev)
            with pytest.raises(DeviceError, match=message):
                case(s)
            assert _tables(dev) == before, label
            dev.unmap(s.va + s.g, s.g)
            for h in (s.h1, s.h2, s.h3):
                dev.release(h)
            dev.unreserve(s.va, 4 * s.g)
        assert not dev.reservations and not dev.mappings and not dev.mappings.handles
    finally:
        close = getattr(dev, "close", None)
        if close is not None:
            close()


def test_a_refused_map_leaves_the_device_usable():
    s = _setup(SimDevice("h200"))
    with pytest.raises(DeviceError, match="already mapped"):
        s.dev.map(s.va, 2 * s.g, s.h3)
    s.dev.map(s.va + 2 * s.g, 2 * s.g, s.h3)  # the free tail is still mappable
    s.dev.map(s.va, s.g, s.h2)
    assert sorted(s.dev.mappings) == [s.va, s.va + s.g, s.va + 2 * s.g]
    assert dict(s.dev.mappings.handles) == {s.h1: 1, s.h2: 1, s.h3: 1}


OPS = st.lists(st.tuples(st.booleans(), st.integers(0, 15), st.integers(1, 4)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_map_is_refused_exactly_when_it_overlaps(ops):
    """Against a byte-set model: a map succeeds iff it is inside the reservation and touches no
    mapped granule; an unmap succeeds iff it names a live mapping exactly."""
    dev = SimDevice("h200")
    g = dev.granularity
    va = dev.reserve(16 * g)
    live: dict[int, tuple[int, int]] = {}  # start granule -> (granules, handle)
    for is_map, at, n in ops:
        taken = {k for s, (m, _) in live.items() for k in range(s, s + m)}
        if is_map:
            h = dev.create(n * g)
            ok = at + n <= 16 and not taken & set(range(at, at + n))
            if ok:
                dev.map(va + at * g, n * g, h)
                live[at] = (n, h)
            else:
                with pytest.raises(DeviceError):
                    dev.map(va + at * g, n * g, h)
                dev.release(h)
        elif at in live and live[at][0] == n:
            dev.unmap(va + at * g, n * g)
            dev.release(live.pop(at)[1])
        else:
            with pytest.raises(DeviceError, match="not mapped"):
                dev.unmap(va + at * g, n * g)
        assert dev.mappings.starts == sorted(dev.mappings)
        assert {(s - va) // g: v for s, v in dev.mappings.items()} == {
            s: (m * g, h) for s, (m, h) in live.items()}
