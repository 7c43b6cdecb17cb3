"""SGLang's plan per version, picked by the installed version (no SGLang needed to build one)."""

from __future__ import annotations

import pytest

from workbench.adapters.sglang import plan as p23
from workbench.adapters.sglang import plan0516


@pytest.mark.parametrize(("installed", "want"), [("0.5.16", plan0516.RANGE),
                                                  ("0.5.23", p23.RANGE), (None, p23.RANGE)])
def test_the_installed_version_picks_its_plan(monkeypatch, installed, want):
    import workbench.adapters.versions as versions

    monkeypatch.setattr(versions, "dist_version",
                        lambda *d: None if installed is None else ("sglang", installed))
    plan = p23.build_plan()
    assert {p.versions for p in plan.patches} == {want}
    assert [p.name for p in plan.patches] == [
        "elastic-mha-pool", "elastic-mla-pool", "elastic-token-allocator",
        "elastic-paged-allocator", "radix-cache-bound", "kv-budget", "leak-check-unheld"]


def test_a_version_between_the_two_is_refused_naming_both():
    plan = p23.build_plan()
    chosen, problems, _ = plan.select("0.5.20")
    assert chosen == [] and len(problems) == 5  # every required patch, none applied
    assert all("installed is 0.5.20" in why and "sglang==0.5.23 or sglang==0.5.16" in fix
               for _, why, fix in problems)


def test_need_source_reads_a_methods_text():
    def f(self):
        return self.is_not_in_free_group

    assert plan0516.need_source(f, "is_not_in_free_group") is None
    assert "no longer uses free_group is None" in plan0516.need_source(f, "free_group is None")
