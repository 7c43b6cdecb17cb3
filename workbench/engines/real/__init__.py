"""Real engines behind the :class:`~workbench.engines.base.Engine` protocol: each instance an
engine process of its own (vLLM's OpenAI server, SGLang's server), driven over HTTP with a
streaming client; what every such kind shares is :class:`~.server.ServerEngine`."""

from __future__ import annotations

from workbench.engines.real.server import ServerEngine
from workbench.engines.real.sglang import SglangEngine, SglangSpec, sglang_missing
from workbench.engines.real.vllm import VllmEngine, VllmSpec, vllm_missing

__all__ = ["ServerEngine", "SglangEngine", "SglangSpec", "VllmEngine", "VllmSpec", "sglang_missing",
           "vllm_missing"]
