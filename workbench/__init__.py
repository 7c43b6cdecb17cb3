"""KV Cache Workbench: elastic KV-cache memory for LLM serving, simulated and on real GPUs."""

from __future__ import annotations

__version__ = "0.1.0"
