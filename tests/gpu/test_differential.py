"""The differential test: the same op trace on the simulated GPU and on the real one gives the
identical sequence of state events (timings aside), over 200 seeded traces with limits and faults.
"""

from __future__ import annotations

import pytest

from workbench.bench.difftrace import random_trace, run_both
from workbench.sim.device import SimDevice

pytestmark = pytest.mark.gpu
SEEDS = range(200)


def test_sim_and_gpu_traces_agree(cuda_dev):
    from workbench.gpu.device import CudaDevice

    free0 = cuda_dev.mem_info().free
    bad, events, faults = [], 0, 0
    for seed in SEEDS:
        ops = random_trace(seed)
        faults += sum(op["op"] == "fail" for op in ops)
        r = run_both(ops, lambda **kw: SimDevice(**kw), lambda **kw: CudaDevice(0, **kw),
                     seed=seed, cleanup=lambda d: d.close() if isinstance(d, CudaDevice) else None)
        events += len(r.keys_a)
        if not r.equal:
            bad.append(r.explain())
    print(f"\n{len(SEEDS)} traces, {events} events each side, {faults} injected-fault ops")
    assert not bad, "\n".join(bad[:10])
    assert faults > 100 and events > 2000
    assert cuda_dev.mem_info().free == free0  # every trace gave its memory back
