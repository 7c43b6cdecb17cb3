"""The engines' own adapters and self-test questions 4, 6 and 10, run in chapter cells on the
core's calls (no vLLM or SGLang needed): each cell calls the adapter code itself, not a copy,
and prints what the chapter text says it shows."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the tensor views need torch (make torch)")

from .test_statements import cell, run_cell  # noqa: E402


def test_ch05_runs_vllms_block_pool_and_sglangs_allocator_decisions(capsys):
    src = cell("05_one_request", "c519d")
    for call in ("backable_count(kv,", "hold_backable(kv,", "LedgerSlots.over(pool",
                 "slots.alloc_slots(", "slots.free_slots(", "make_ledger("):
        assert call in src, call
    out = run_cell("05_one_request", "c519d", capsys).splitlines()
    assert out[0] == ("vLLM's free queue: 63 blocks; told free: 31 "
                      "(free on backed pages 15 + room for 16)")  # the limit, not the queue
    assert out[1] == "hold 20 -> blocks 1..20, mapped 32 MiB"
    assert out[2].startswith("hold 20 more -> PoolExhausted; still mapped 32 MiB, held 20")
    assert out[3] == "release -> held 0, mapped 16 MiB"
    assert out[4] == "SGLang alloc 256 slots -> slots 16..271, mapped 32 MiB"
    # SGLang checks available_size() before it allocates; the allocator's answer is honest
    assert out[5] == ("available_size() = 752 slots < 768: SGLang's own checks stop here "
                      "(retract, wait)")
    assert out[6].startswith("alloc 768 anyway -> None; in SGLang alloc_token_slots would now "
                             "raise 'Out of memory'")
    assert out[7] == "free -> mapped 16 MiB"


def test_the_pool_and_the_adapters_share_the_decision_code():
    import inspect

    from workbench.adapters.sglang import slots, views
    from workbench.adapters.vllm import backable, worker

    pool = (backable.__file__.replace("backable.py", "pool.py"))
    text = open(pool, encoding="utf-8").read()
    assert "backable_count(kv, n," in text and "hold_backable(self.backing," in text
    assert "kv_strides(space)" in inspect.getsource(worker.make_allocate_kv_cache)
    sgl = slots.__file__.replace("slots.py", "allocator.py")
    assert "LedgerSlots" in open(sgl, encoding="utf-8").read()
    assert "from workbench.adapters.sglang.views import build_views" in open(
        views.__file__.replace("views.py", "pool.py"), encoding="utf-8").read()


def test_ch05_builds_each_engines_kv_view_and_q4_survives_an_unmap(capsys):
    src = cell("05_one_request", "c519f")
    for call in ("tensor_geometry(", "kv_strides(kv.space)", "build_views(sg,",
                 "LedgerSlots.over(sg.ledger)"):
        assert call in src, call
    out = run_cell("05_one_request", "c519f", capsys).splitlines()
    assert "reserved 8 MiB of address space, mapped 4 MiB" in out[0]
    assert "CONTIGUOUS: layer stride 32 KiB, block stride 64 KiB" in out[0]
    a, b = out[1].split("at byte ")[1].split(" = the ledger's ")
    assert a == b  # vLLM's addressing with the adapter's strides lands on the ledger's block
    assert "k_buffer[0] shape (8192, 4, 64), stride (1024, 64, 1)" in out[2]
    assert "reserved 16 MiB, mapped 8 MiB" in out[2]  # the range before its pages
    assert out[3] == "Q4: 8 tokens written on page id 1: read 2048, mapped 16 MiB"
    assert "mapped 8 MiB; k_buffer[0] still exists, address unchanged True" in out[4]
    assert "the 8 tokens read 0 (the host's read-only zero page: a write now would fault" in out[4]
    assert out[5].endswith("the next 8 tokens read 4096")  # the same view, new memory


def test_ch03_q6_the_same_tree_decides_alike_over_both_pools(capsys):
    src = cell("03_prefix_ownership", "c06d")
    assert "RadixCache(pool)" in src and "PoolConfig(prealloc=True)" in src
    out = run_cell("03_prefix_ownership", "c06d", capsys).splitlines()
    assert out[-1] == "the tree's answers agree: True"
    assert "hit  8 tokens" in out[1] and "hit  8 tokens" in out[2]
    static = [line.split("|")[0] for line in out[:-1]]
    elastic = [line.split("|")[1] for line in out[:-1]]
    assert all("mapped  64 MiB" in s for s in static)  # stock-like: all backed, always
    assert "mapped  32 MiB" in elastic[0] and "mapped  16 MiB" in elastic[-1]  # follows use


def test_ch10_q10_an_unmap_drops_the_bytes_and_a_budget_isolates_nothing(capsys):
    out = run_cell("10_beyond_hbm", "c05b", capsys).splitlines()
    assert out[1] == "written: 7; mapped 8 MiB"
    assert out[2].startswith("freed:   0; mapped 4 MiB")  # gone, not moved to a tier
    assert out[3].endswith(": None (no page left)")  # nothing set aside for tenant B
    assert out[4].startswith("A frees; B asks again: 128 blocks")
