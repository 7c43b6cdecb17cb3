"""Which vLLM build an interpreter runs: vLLM's own compiled op library, or the import-only
stand-in the GPU machine's recipe puts in its place where the library cannot travel
(``gpu/vllm26/opstub.py``). The records name it; the GPU engines pick their kernels by it (the
stand-in has no attention or custom op kernels, so it needs Triton attention and native ops).
"""

from __future__ import annotations

import importlib.util
import os

COMPILED = "compiled ops"


def build() -> str:
    """``compiled ops`` when ``vllm._C_stable_libtorch`` resolves to the shared library, else
    ``stand-in (...)`` with the recipe's reason, else ``no vLLM``."""
    try:
        spec = importlib.util.find_spec("vllm._C_stable_libtorch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        return "no vLLM" if importlib.util.find_spec("vllm") is None else "stand-in (no op library)"
    if spec.origin.endswith(".so"):
        return COMPILED
    return os.environ.get("WORKBENCH_VLLM_BUILD", "").strip() or "stand-in (opstub.py)"


def compiled() -> bool:
    return build() == COMPILED
