"""Chapter 07's tools: the CLI against a pool this process owns, variants per version, the
stand-in engine's upgrade, the decision tree."""

from __future__ import annotations

import json
import os
import sys

import pytest

from workbench.adapters.registry import AutopatchError
from workbench.adapters.vllm.plan import build_plan
from workbench.config import PoolConfig
from workbench.core import control
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.sim.device import SimDevice
from workbench.units import MiB
from workbench.viz.operate import (
    FAILURE_TREE,
    cli,
    cli_while_owning,
    pool_panel,
    remove_toy_engine,
    toy_engine,
    toy_plan,
    tree_figure,
    variant_figure,
    variant_matrix,
)


@pytest.fixture
def pool():
    name = f"t07_{os.getpid()}"
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640)  # 10 x 8 MiB
    kv = KVCacheManager(geo, SimDevice(), name=name,
                        config=PoolConfig(ipc_name=name, min_reserved_pages=1,
                                          max_reserved_pages=2))
    held = [kv.alloc(63)] + [kv.alloc(64) for _ in range(4)]  # pages 0..4 in use
    yield name, kv, held
    kv.close()
    control.segment_path(name).unlink(missing_ok=True)


def test_limit_from_the_cli_is_answered_while_the_owner_polls(pool):
    name, kv, held = pool
    r = cli_while_owning(kv, "kvctl", "limit", name, "24MiB", "--wait", "10", "--json")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["answer"] == "acknowledged" and answer["outcome"] == "deferred"
    assert kv.limit_state.outcome.value == "deferred" and kv.limit_state.target_pages == 3
    kv.free(held.pop())
    kv.free(held.pop())
    assert kv.limit_state.outcome.value == "applied"
    assert kv.mapped_bytes == 3 * 8 * MiB
    top = cli("kvtop", "--once", "--width", "10")
    panel = pool_panel(top.stdout, name)
    assert panel.startswith("pages:") and f"╭─ {name} " in panel
    assert "limit 24.00 MiB of 80.00 MiB" in panel and "███×××××××" in panel
    assert panel.splitlines()[-1].startswith("╰")


def test_pool_panel_of_an_absent_pool_is_empty():
    assert pool_panel("pages: x\n╭─ other ─╮\n│ a │\n╰───╯\n", "mine") == ""


def test_variant_matrix_of_the_vllm_plan():
    vs = ["0.31.2", "0.32.0+cpu", "0.33.0", "0.34.0"]
    rows = variant_matrix(build_plan(), vs)
    assert rows == [
        {"patch": "elastic-block-pool", "0.31.2": "refused", "0.32.0+cpu": ">=0.32.0,<0.33.0",
         "0.33.0": ">=0.33.0,<0.34.0", "0.34.0": "refused"},
        {"patch": "allocate-slots-miss", "0.31.2": "refused", "0.32.0+cpu": ">=0.32.0,<0.34.0",
         "0.33.0": ">=0.32.0,<0.34.0", "0.34.0": "refused"},
        {"patch": "elastic-kv-tensors", "0.31.2": "refused", "0.32.0+cpu": ">=0.32.0,<0.34.0",
         "0.33.0": ">=0.32.0,<0.34.0", "0.34.0": "refused"},
        {"patch": "idle-tidy", "0.31.2": "none", "0.32.0+cpu": ">=0.32.0,<0.34.0",
         "0.33.0": ">=0.32.0,<0.34.0", "0.34.0": "none"},  # optional: refused by no version
        {"patch": "step-refill", "0.31.2": "none", "0.32.0+cpu": ">=0.32.0,<0.34.0",
         "0.33.0": ">=0.32.0,<0.34.0", "0.34.0": "none"}]
    fig = variant_figure(rows, vs)
    # refused is 0; the three distinct ranges, sorted, are 1..3; an optional patch's none is 4
    assert [list(r) for r in fig.data[0].z] == [[0, 1, 3, 0], [0, 2, 2, 0], [0, 2, 2, 0],
                                                [4, 2, 2, 4], [4, 2, 2, 4]]


def test_toy_upgrade_refuses_a_moved_seam_and_patches_nothing():
    try:
        toy_engine("0.2.0", lookahead=False)  # says 0.2 but lacks 0.2's seam
        plan = toy_plan()
        with pytest.raises(AutopatchError, match="has no parameter lookahead_tokens"):
            plan.apply_all()
        assert plan.state == "failed"
        assert sys.modules["toyserve.block_pool"].BlockPool.__name__ == "BlockPool"
        toy_engine("0.3.0", lookahead=True)
        with pytest.raises(AutopatchError, match="installed is 0.3.0"):
            toy_plan().apply_all()
        toy_engine("0.2.1", lookahead=True)
        plan = toy_plan()
        plan.apply_all()
        assert plan.state == "applied" and [r.versions for r in plan.records] == [">=0.2,<0.3"]
        assert sys.modules["toyserve.block_pool"].BlockPool.elastic is True
        plan.revert()
        assert not hasattr(sys.modules["toyserve.block_pool"].BlockPool, "elastic")
    finally:
        remove_toy_engine()
    assert "toyserve" not in sys.modules


def test_decision_tree_is_a_tree():
    names = [n for n, _, _ in FAILURE_TREE]
    assert len(names) == len(set(names)) == 31
    assert {p for _, p, _ in FAILURE_TREE} - {""} <= set(names)
    assert [n for n, p, _ in FAILURE_TREE if not p] == ["start-up fails", "runtime fault"]
    assert all(h for _, p, h in FAILURE_TREE if p)  # every symptom says what to look at
    assert len(tree_figure().data[0].labels) == 31


def test_cli_output_is_plain_text():
    r = cli("kvctl", "list", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert r.returncode == 0 and "\x1b[" not in r.stdout
