"""Which vLLM build an interpreter has, read from where ``vllm._C_stable_libtorch`` resolves,
and the CUDA engine's kernels picked by it. Each case runs in a fresh interpreter over a fake
``vllm`` package (an empty ``__init__`` and the op module as a file), so nothing is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import json
from workbench.engines.real import vllm_build
from workbench.engines.real.vllm import VllmSpec
args = VllmSpec(model="m", device="cuda", cuda_graphs=True).args(8000, "m")
print(json.dumps({"build": vllm_build.build(), "triton": "TRITON_ATTN" in args,
                  "eager": "--enforce-eager" in args}))
"""


def _probe(tmp_path: Path, op_file: str | None, note: str = "") -> dict:
    site = tmp_path / "site"
    if op_file is not None:
        (site / "vllm").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("")
        (site / "vllm" / op_file).write_text("")
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_VLLM_BUILD"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    if note:
        env["WORKBENCH_VLLM_BUILD"] = note
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(any(Path(p, "vllm").exists() for p in sys.path if p),
                    reason="a real vLLM is importable here")
def test_no_vllm_keeps_the_stand_in_kernels(tmp_path):
    assert _probe(tmp_path, None) == {"build": "no vLLM", "triton": True, "eager": False}


def test_the_compiled_library_gives_vllm_its_own_kernels(tmp_path):
    r = _probe(tmp_path, "_C_stable_libtorch.abi3.so")
    assert r == {"build": "compiled ops", "triton": False, "eager": False}


def test_the_stand_in_module_is_named_with_the_recipe_reason(tmp_path):
    r = _probe(tmp_path, "_C_stable_libtorch.py", "stand-in (opstub.py: no op library)")
    assert r == {"build": "stand-in (opstub.py: no op library)", "triton": True, "eager": False}
