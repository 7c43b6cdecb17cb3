"""The mini engine's warm-up runs every kind of step a serving run meets; the compile log hooks
Triton's compile hooks (a stand-in module here: CPU CI has no Triton)."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")

from workbench.mini.engine import Engine, EngineConfig, StepStats  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402
from workbench.mini.warmup import CompileLog, step_shape, warm_up  # noqa: E402

CFG = get_config("tiny")


def test_warm_up_runs_every_kind_of_step_then_leaves_the_engine_idle():
    eng = Engine(CFG, KVSpec("block", "static", 8 << 20), model=build_model(CFG),
                 cfg=EngineConfig(max_batched_tokens=128))
    steps = warm_up(eng, prompt_len=24, decodes=4)
    pure = [s for s in steps if s.prefills and not s.num_decode]
    mixed = [s for s in steps if s.prefills and s.num_decode]
    assert pure and [s for s in steps if s.num_decode and not s.prefills]
    assert {len(s.prefills) for s in mixed} >= {1, 2}
    # recompute-like lengths (not multiples of 16) beside decodes
    assert any(q % 16 and q == c for s in mixed for q, c in s.prefills)
    # a chunk over earlier context (the long prompt's second chunk)
    assert any(c > q for s in steps for q, c in s.prefills)
    assert not eng.has_work() and eng.stats.steps == []
    assert eng.kv.manager.used_blocks == 0
    eng.close()


def test_step_shape_names_decodes_prefills_and_graphs():
    assert step_shape(StepStats(num_decode=16, prefills=((258, 258), (6, 262)))) == \
        "16 dec + pre 258/258 + pre 6/262"
    assert step_shape(StepStats(num_decode=4, graphed=True)) == "4 dec (graphed)"


@pytest.mark.parametrize("knobs", [True, False])
def test_compile_log_hooks_triton_and_restores(monkeypatch, knobs):
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = type("JITFunction", (), {"cache_hook": None, "compiled_hook": None})
    tri = types.ModuleType("triton")
    runtime = types.SimpleNamespace(jit_cache_hook=None, jit_post_compile_hook=None)
    if knobs:
        tri.knobs = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "triton", tri)
    monkeypatch.setitem(sys.modules, "triton.runtime", types.ModuleType("triton.runtime"))
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    owner = runtime if knobs else jit.JITFunction
    start, end = (("jit_cache_hook", "jit_post_compile_hook") if knobs
                  else ("cache_hook", "compiled_hook"))
    log = CompileLog()
    assert log.install()
    assert log.installed == ("triton.knobs.runtime.jit_cache_hook" if knobs
                             else "JITFunction.cache_hook")
    assert getattr(owner, start)(key="k", repr="_paged_decode_kernel[...]", fn=None) is None
    getattr(owner, end)(key="k")
    (ev,) = log.events
    assert ev[2] == "_paged_decode_kernel[...]" and ev[1] >= ev[0]
    (taken,) = log.take(ev[0])
    assert taken[0] == 0.0 and taken[2] == "_paged_decode_kernel[...]" and log.events == []
    log.uninstall()
    assert getattr(owner, start) is None and getattr(owner, end) is None


def test_compile_log_without_triton_installs_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    log = CompileLog()
    assert not log.install() and log.installed == ""


def test_probe_reports_each_phase_on_cpu(capsys, monkeypatch):
    from workbench.mini import warmup

    monkeypatch.setitem(sys.modules, "triton", None)
    assert warmup.main(["--device", "cpu", "--model", "tiny", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("triton compile hook: not available\n")
    phases = [line[:-1] for line in out.splitlines() if line.endswith(":")]
    assert phases == ["old warm-up (one 256-token prompt)", "warm-up, first pass",
                      "warm-up, second pass", "fresh shapes after the warm-up"]
    steps = [line.split(" ms  ")[1] for line in out.splitlines() if " ms  " in line]
    assert any(" dec + pre " in st for st in steps)  # mixed steps, their kind named
    assert out.count("  phase ") == 4 and "compile at" not in out
