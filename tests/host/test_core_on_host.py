"""The core's fault and stateful ledger tests, re-run with the host device under them.

Those modules build ``SimDevice(...)``; here that name is swapped for a HostDevice with the same
constructor, so every map is a real ``mmap`` of a memfd and every rollback a real unmap.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.core import test_faults as _faults
from tests.core import test_ledger_stateful as _stateful
from workbench.host.device import HostDevice

_made: list[HostDevice] = []


class _HostAsSim(HostDevice):
    def __init__(self, preset: str = "h200", *, capacity: int | None = None, env=None,
                 name: str | None = None):
        super().__init__(capacity=capacity, name=name or f"host-as-{preset}")
        _made.append(self)


@pytest.fixture(autouse=True)
def _on_host(monkeypatch):
    monkeypatch.setattr(_faults, "SimDevice", _HostAsSim)
    monkeypatch.setattr(_stateful, "SimDevice", _HostAsSim)
    yield
    while _made:
        dev = _made.pop()
        try:
            dev.close()
        except Exception:  # noqa: BLE001 - a test may leave a quarantined page behind
            pass


globals().update({k: v for k, v in vars(_faults).items() if k.startswith("test_")})


class TestLedgerOnHost(_stateful.LedgerMachine.TestCase):
    # the machine's logic gets 300 examples on the simulated device (test_ledger_stateful);
    # here each map is a real mmap (about 0.15 s an example), and 100 prove the host under it
    settings = settings(max_examples=100, stateful_step_count=40, deadline=None,
                        suppress_health_check=[HealthCheck.too_slow])
