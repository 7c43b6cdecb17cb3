"""Each engine's plans by version: one table picks the plan module for the installed version
(no engine needed to build one); a version without a plan is refused in one line, patching
nothing; no plan module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workbench.adapters.versions as versions
from workbench.adapters.patching import need_source
from workbench.adapters.registry import AutopatchError
from workbench.adapters.sglang import plan as sgl23
from workbench.adapters.sglang import plan0516
from workbench.adapters.sglang import plans as sglang_plans
from workbench.adapters.vllm import plan as vllm33
from workbench.adapters.vllm import plan26, plan34
from workbench.adapters.vllm import plans as vllm_plans

ADAPTERS = Path(__file__).resolve().parents[2] / "workbench" / "adapters"


def _installed(monkeypatch, dist, version):
    monkeypatch.setattr(versions, "dist_version",
                        lambda *d: None if version is None else (dist, version))


@pytest.mark.parametrize(("installed", "want"), [("0.5.16", plan0516.RANGE),
                                                  ("0.5.23", sgl23.RANGE)])
def test_the_installed_sglang_picks_its_plan(monkeypatch, installed, want):
    _installed(monkeypatch, "sglang", installed)
    plan = sglang_plans.build_plan()
    assert {p.versions for p in plan.patches} == {want}
    assert [p.name for p in plan.patches] == [
        "elastic-mha-pool", "elastic-mla-pool", "elastic-token-allocator",
        "elastic-paged-allocator", "radix-cache-bound", "kv-budget", "leak-check-unheld",
        "admission-charge", "decode-charge"]


@pytest.mark.parametrize(("installed", "module"), [
    ("0.26.0", plan26), ("0.32.0+cpu", vllm33), ("0.33.0", vllm33), ("0.34.0", plan34)])
def test_the_installed_vllm_picks_its_plan(monkeypatch, installed, module):
    _installed(monkeypatch, "vllm", installed)
    plan = vllm_plans.build_plan()
    chosen, problems, _ = plan.select(installed)
    assert problems == [] and chosen
    assert all(installed in versions.VersionRange(p.versions) for p in chosen)
    assert vllm_plans.TABLE.row_for(installed).module is module


@pytest.mark.parametrize(("table", "version"), [(vllm_plans.TABLE, "0.31.2"),
                                                (vllm_plans.TABLE, "0.35.0"),
                                                (sglang_plans.TABLE, "0.5.20")])
def test_a_version_without_a_plan_is_refused_in_one_line(monkeypatch, table, version):
    _installed(monkeypatch, table.dists[0], version)
    plan = table.build()
    chosen, problems, _ = plan.select(version)
    assert chosen == [] and len(problems) == 1
    err = AutopatchError(table.engine, version, problems)
    msg = str(err)
    assert "\n" not in msg and msg.count(". Fix: ") == 1, msg
    assert f"no plan for {table.engine} {version}" in msg and "nothing was patched" in msg
    assert all(row.versions in msg and row.tested in msg for row in table.rows)
    assert plan.targets == [table.package]  # armed by the engine's first module: it refuses


def test_an_unknown_installed_version_is_refused_too(monkeypatch):
    _installed(monkeypatch, "vllm", None)
    _, problems, _ = vllm_plans.build_plan().select(None)
    assert [why for _, why, _ in problems] == ["cannot tell the installed vllm version"]


def test_the_vllm_plans_name_the_same_patches_across_releases():
    names = {m: [p.name for p in m.build_plan().patches] for m in (plan26, vllm33, plan34)}
    for m, ns in names.items():
        assert ns[:1] == ["elastic-block-pool"] and "allocate-slots-miss" in ns
        # every release's idle loop and two-phase step, optional in each
        assert ns[-2:] == ["idle-tidy", "step-refill"]
        assert all(not p.required for p in m.build_plan().patches[-2:])
    assert names[plan34] == ["elastic-block-pool", "allocate-slots-miss", "elastic-kv-cache",
                             "kv-sizing", "idle-tidy", "step-refill"]


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_no_plan_imports_another(engine):
    plans = sorted((ADAPTERS / engine).glob("plan*.py"))
    mods = {f"workbench.adapters.{engine}.{p.stem}" for p in plans if p.stem != "plans"}
    assert len(mods) >= 2
    for p in plans:
        if p.stem == "plans":  # the table imports every plan; no plan imports the table
            continue
        others = _imports(p) & (mods | {f"workbench.adapters.{engine}.plans"})
        assert others == set(), (p.name, others)


def test_need_source_reads_a_methods_text():
    def f(self):
        return self.is_not_in_free_group

    assert need_source(f, "is_not_in_free_group") is None
    assert "no longer uses free_group is None" in need_source(f, "free_group is None")


def test_a_registered_refusal_stops_the_engines_import_in_one_line(tmp_path, monkeypatch):
    import sys

    from workbench.adapters import boot
    from workbench.adapters.plan_table import PlanRow, PlanTable

    (tmp_path / "fakeeng34").mkdir()
    (tmp_path / "fakeeng34" / "__init__.py").write_text("__version__ = '9.9'\n")
    (tmp_path / "fakeeng34" / "pool.py").write_text("class Pool: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _installed(monkeypatch, "fakeeng34", "9.9")
    table = PlanTable("fakeeng34", "fakeeng34", ("fakeeng34",),
                      (PlanRow(">=1.0,<2.0", sgl23, "fakeeng34==1.0"),))
    try:
        plan = boot.register(table.build())
        with pytest.raises(AutopatchError) as err:
            import fakeeng34.pool  # noqa: F401
        assert plan.state == "failed" and "\n" not in str(err.value)
        assert "no plan for fakeeng34 9.9 (plans: >=1.0,<2.0)" in str(err.value)
    finally:
        boot.reset()
        for name in [m for m in sys.modules if m.startswith("fakeeng34")]:
            del sys.modules[name]
