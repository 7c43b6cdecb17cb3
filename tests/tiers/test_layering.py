"""The tier model's pure part needs no SimPy (mirroring engines/sched vs engines/sim): importing
it loads neither simpy nor torch, and it imports nothing from the simulator or the engines' SimPy
side. Only :mod:`workbench.tiers.sim` sits on the SimPy driver."""

from __future__ import annotations

import subprocess
import sys


def test_the_pure_tier_model_loads_no_simpy():
    code = ("import sys\n"
            "import workbench.tiers.model, workbench.tiers.presets\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('simpy', 'torch') or m.startswith(('workbench.sim', 'workbench.engines.sim')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
