"""Real engines behind the :class:`~workbench.engines.base.Engine` protocol: each instance an
engine process of its own (vLLM's OpenAI server), driven over HTTP with a streaming client."""

from __future__ import annotations

from workbench.engines.real.vllm import VllmEngine, VllmSpec, vllm_missing

__all__ = ["VllmEngine", "VllmSpec", "vllm_missing"]
