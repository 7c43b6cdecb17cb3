"""vLLM's real BlockPool under the elastic pool and a memory limit (the vLLM venvs: ``make
test-engines``): the work of a scheduler step does not grow with the pool's virtual capacity
(Python lines counted, not time), and the blocks it hands out stay within the limit."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs a vLLM venv (make test-engines)")]

MiB, GiB = 1 << 20, 1 << 30


def _lines(capacity: int, limit: int) -> list[int]:
    from workbench.bench import vllm_steps as vs

    pool = vs.elastic_pool(capacity // vs.BLOCK_BYTES, limit)
    assert type(pool).__mro__[1].__module__ == "vllm.v1.core.block_pool"  # vLLM's own class
    sch = vs.Scheduler(pool, batch=64)
    for _ in range(30):
        sch.step()
    out = [vs.count_lines(sch.step) for _ in range(12)]
    assert sch.preempted > 0 and pool.shortfalls > 0
    assert pool.backing.mapped_bytes <= limit
    pool.backing.check_invariants()
    pool.backing.close()
    return out


def test_lines_per_step_over_vllms_block_pool_do_not_grow_with_capacity():
    small = _lines(1 * GiB, 64 * MiB)
    big = _lines(16 * GiB, 64 * MiB)  # 131,072 blocks in vLLM's free queue
    assert small == big, (small, big)
