"""The ordinary GPU host's recipe (mk/gpu.mk) on a machine without a GPU: every target refuses
in one line and builds nothing. (On a GPU host the refusal does not apply: skipped.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.skipif(_gpus() > 0, reason="a GPU is visible: the recipe would build")
@pytest.mark.parametrize("target", ["gpu-venv", "gpu-labs", "gpu-bench"])
def test_without_a_gpu_each_target_refuses_in_one_line(target, tmp_path):
    venv = tmp_path / "venv"
    proc = subprocess.run(["make", "--no-print-directory", "-s", target, f"GPU_VENV={venv}",
                           f"GPU_OUT={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"make {target}: no NVIDIA GPU visible"), \
        proc.stdout
    assert "run it on a GPU host" in lines[0]
    assert not venv.exists() and not (tmp_path / "out").exists()
