"""Importing the core, the sim backend or the gpu package never pulls in torch or CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
import workbench.core.device, workbench.core.ledger, workbench.core.replay, workbench.sim.device
import workbench.gpu, workbench.bench.difftrace
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda', 'numba', 'cupy'))
print(','.join(heavy))
"""


@pytest.mark.parametrize("where", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_core_and_sim_import_no_torch_or_cuda(where):
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"
