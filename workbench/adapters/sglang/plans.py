"""SGLang's plans by version: the one table ``boot`` and ``doctor`` read. A new release gets a
plan module of its own and a row here; seams both plans share live in ``seams.py``."""

from __future__ import annotations

from workbench.adapters.plan_table import PlanRow, PlanTable
from workbench.adapters.sglang import plan, plan0516

TABLE = PlanTable("sglang", "sglang", ("sglang",), (
    PlanRow(plan0516.RANGE, plan0516, "sglang==0.5.16"),
    PlanRow(plan.RANGE, plan, "sglang==0.5.23"),
))

# What the adapter accepts (``workbench doctor`` prints it): the pool lives in the scheduler
# process that owns the model runner, one per TP rank; ranks would each page their own pool under
# one IPC name, so TP > 1 is not supported here.
ACCEPTS = {"executors": ["scheduler"], "tensor_parallel": "1",
           "note": "KV pool in the scheduler process; overlap scheduling fenced"}


def build_plan():
    """The plan for the installed SGLang (one that refuses in one line when none fits)."""
    return TABLE.build()
