"""A replay on the CUDA device that stops (or whose ops fail) leaves the device holding nothing:
no allocation, mapping or reservation, and the driver's free memory back where it started.

The same leak checks as tests/gpu/test_faults.py: the device's own records, then cuMemGetInfo.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from tests.hostile.test_replay import near_valid
from workbench.core import control
from workbench.core.replay import replay
from workbench.errors import ConfigError

pytestmark = pytest.mark.gpu
IPC = f"wbgpuleak_{os.getpid()}"


def _driver_free() -> int:
    from workbench.gpu.driver import call, driver

    return int(call("cuMemGetInfo", driver().cuMemGetInfo)[0])


def _holds_nothing(dev) -> None:
    zero = dev.zero.held_bytes if dev.zero is not None else 0
    # the device's own records: handles created, mappings and reservations (DriverRefusals)
    assert (dev._alloc, dict(dev.mappings), dict(dev.reservations)) == ({}, {}, {})
    assert dev.held_bytes == zero  # the zero page is the device's own, not the replay's


def test_a_failed_replay_leaves_the_cuda_device_empty(cuda_dev):
    free0 = _driver_free()
    ops = [{"op": "pool", "pool": "a", "num_layers": 2, "num_blocks": 512, "ipc_name": IPC},
           {"op": "alloc", "pool": "a", "n": 300},
           {"op": "pool", "pool": "b", "layout": "per_layer", "num_blocks": 256},
           {"op": "alloc", "pool": "b", "n": 100},
           {"op": "fail", "call": "unmap", "nth": 1},  # pending at the stop: cleared for clean-up
           {"op": "pool", "pool": "c", "ipc_name": IPC}]  # the name is taken: the replay stops
    with pytest.raises(ConfigError, match=r"^line 6: IPC name 'wbgpuleak_\d+': in use by "):
        replay(ops, lambda **kw: cuda_dev)
    _holds_nothing(cuda_dev)
    assert control.read_segment(IPC) is None
    cuda_dev.close()
    assert _driver_free() == free0


def test_a_close_whose_unmaps_fail_still_gives_everything_back(cuda_dev):
    from workbench.backends import make_device

    free0 = _driver_free()
    faults = [{"op": "fail", "call": c, "nth": k} for c in ("unmap", "release") for k in (1, 2)]
    ops = [{"op": "pool", "pool": "a", "layout": "per_layer", "num_blocks": 256},
           {"op": "alloc", "pool": "a", "n": 200}, *faults, {"op": "close", "pool": "a"}]
    r = replay(ops, lambda **kw: cuda_dev)
    on_sim = replay(ops, lambda **kw: make_device("sim"))  # the same core: the same outcomes
    assert [x.result for x in r.results] == [x.result for x in on_sim.results]
    assert r.events.keys() == on_sim.events.keys()
    _holds_nothing(cuda_dev)
    cuda_dev.close()
    assert _driver_free() == free0


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=near_valid)
def test_hostile_traces_leave_the_cuda_device_empty(cuda_dev, ops):
    try:
        replay([op for op in ops if not (isinstance(op, dict) and op.get("op") == "occupy")],
               lambda **kw: cuda_dev)
    except ConfigError as err:
        assert "\n" not in str(err)
    _holds_nothing(cuda_dev)
