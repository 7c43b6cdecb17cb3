"""Real engines behind the :class:`~workbench.engines.base.Engine` protocol: each instance an
engine process of its own (vLLM's OpenAI server, SGLang's server), driven over HTTP with a
streaming client."""

from __future__ import annotations

from workbench.engines.real.sglang import SglangEngine, SglangSpec, sglang_missing
from workbench.engines.real.vllm import VllmEngine, VllmSpec, vllm_missing

__all__ = ["SglangEngine", "SglangSpec", "VllmEngine", "VllmSpec", "sglang_missing",
           "vllm_missing"]
