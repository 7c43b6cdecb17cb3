"""pytest plugin for vLLM's own test run: reports how many ElasticBlockPools were built, so the
caller knows vLLM's tests really ran against the substitute."""

from __future__ import annotations

import sys


def pytest_sessionfinish(session, exitstatus):
    mod = sys.modules.get("workbench.adapters.vllm.pool")
    n = mod.ElasticBlockPool.created if mod is not None else 0
    sys.stdout.write(f"\nWORKBENCH_ELASTIC_POOLS={n}\n")
