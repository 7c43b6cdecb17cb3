"""The step recorder without vLLM: what it counts per scheduler output, the line it writes, and
how it boots (its own plan, also with autopatch off). The real classes and a real run are in
tests/engines_real/vllm/test_steplog_real.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest

from workbench.adapters import boot, pth
from workbench.adapters.vllm import steplog
from workbench.adapters.vllm.steplog import StepRecorder, wrap_schedule, wrap_update
from workbench.errors import ConfigError
from workbench.settings import settings


def _out(new=(), cached=(), resumed=(), finished=()):
    """A scheduler output shaped like vLLM's: ``new`` (id, prompt, computed, scheduled),
    ``cached`` (id, computed, scheduled)."""
    sched = {r[0]: r[3] for r in new} | {r[0]: r[2] for r in cached}
    return NS(scheduled_new_reqs=[NS(req_id=i, prompt_token_ids=list(range(p)),
                                     num_computed_tokens=c) for i, p, c, _ in new],
              scheduled_cached_reqs=NS(req_ids=[r[0] for r in cached],
                                       num_computed_tokens=[r[1] for r in cached],
                                       resumed_req_ids=set(resumed)),
              num_scheduled_tokens=sched, finished_req_ids=set(finished))


def test_counts_prefill_decode_chunks_and_recompute():
    rec = StepRecorder("/unused")
    # a: 300-token prompt in a 256 chunk; b: 4-token prompt whole, 1 of them cached
    assert rec.counts(_out(new=[("a", 300, 0, 256), ("b", 4, 1, 3)])) == (
        259, 0, 2, 1, 256 * 257 / 2 + 3 * 1 + 6)
    # a's last 44 prompt tokens; b decodes; c was preempted and recomputes 10 tokens
    rec.prompt_lens["c"] = 8
    p, d, n, ctx, pairs = rec.counts(_out(cached=[("a", 256, 44), ("b", 4, 1), ("c", 0, 10)],
                                          resumed=["c"]))
    assert (p, d, n, ctx) == (54, 1, 3, 260)
    assert pairs == 44 * 256 + 44 * 45 / 2 + (4 + 1) + 55
    # a prompt's last token alone is prefill, not decode; a finished request is forgotten
    rec.counts(_out(new=[("e", 5, 0, 4)]))
    assert rec.counts(_out(cached=[("e", 4, 1)], finished=["a"]))[:2] == (1, 0)
    assert "a" not in rec.prompt_lens and rec.prompt_lens["e"] == 5


def test_one_line_per_step_and_overlapping_async_steps(tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = StepRecorder(str(path))
    s1, s2 = _out(new=[("a", 8, 0, 8)]), _out(cached=[("a", 8, 1)])
    rec.scheduled(s1, 100.0)
    rec.scheduled(s2, 100.5)  # async scheduling: the next step before this one's output
    rec.updated(s1, 101.0)
    rec.updated(s2, 101.25)
    rec.updated(s2, 102.0)  # an output seen twice writes once
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["t"], x["dur_s"]) for x in lines] == [(100.0, 1.0), (100.5, 0.75)]
    assert lines[0] == {"t": 100.0, "dur_s": 1.0, "prefill_tokens": 8, "decode_tokens": 0,
                        "seqs": 1, "ctx_tokens": 0, "attn_pairs": 36}
    assert lines[1]["decode_tokens"] == 1 and lines[1]["prefill_tokens"] == 0
    rec.close()


def test_lines_reach_the_file_as_written_and_a_bad_path_stops_only_the_log(tmp_path, caplog):
    path = tmp_path / "steps.jsonl"
    rec = StepRecorder(str(path))
    so = _out(new=[("a", 2, 0, 2)])
    rec.scheduled(so, 1.0)
    rec.updated(so, 2.0)
    assert path.read_text().count("\n") == 1  # line-buffered: no close needed
    bad = StepRecorder(str(tmp_path / "missing" / "steps.jsonl"))
    bad.scheduled(so, 1.0)
    bad.updated(so, 2.0)  # the engine goes on; one error logged; nothing more is tried
    assert bad.broken and "no more steps are recorded" in caplog.text
    bad.scheduled(so, 3.0)
    assert not bad.pending


def test_pending_outputs_never_processed_are_bounded():
    rec = StepRecorder("/unused")
    outs = [_out(new=[(str(i), 1, 0, 1)]) for i in range(steplog.MAX_PENDING + 5)]
    for i, so in enumerate(outs):
        rec.scheduled(so, float(i))
    assert len(rec.pending) <= steplog.MAX_PENDING


def test_wrappers_pass_through_and_record(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_KV_STEP_LOG", str(tmp_path / "s.jsonl"))
    steplog.reset()
    so = _out(new=[("a", 3, 0, 3)])
    schedule = wrap_schedule(lambda self, *a, **k: so)
    update = wrap_update(lambda self, out, model_out: ("outputs", model_out))
    assert schedule(None, True) is so
    assert update(None, so, "mo") == ("outputs", "mo")
    assert json.loads((tmp_path / "s.jsonl").read_text())["prefill_tokens"] == 3
    steplog.reset()


def test_knob_is_an_absolute_path():
    assert settings({"WORKBENCH_KV_STEP_LOG": "/tmp/x.jsonl"}).step_log == "/tmp/x.jsonl"
    assert settings({}).step_log is None
    with pytest.raises(ConfigError, match="WORKBENCH_KV_STEP_LOG='steps.jsonl': not an absolute"):
        settings({"WORKBENCH_KV_STEP_LOG": "steps.jsonl"})


def test_observer_plan_alone_with_autopatch_off(monkeypatch):
    loaded = []
    monkeypatch.setattr(boot, "load_plan", lambda e: loaded.append(e) or NS(engine=e))
    monkeypatch.setattr(boot, "register", lambda plan: plan)
    monkeypatch.setattr(boot, "dist_version", lambda *d: ("x", "1"))
    monkeypatch.delenv(boot.ENV, raising=False)
    monkeypatch.setenv("WORKBENCH_KV_STEP_LOG", "/tmp/steps.jsonl")
    boot.install()
    assert loaded == ["vllm-steps"]
    loaded.clear()
    monkeypatch.setenv(boot.ENV, "1")
    boot.install()
    assert loaded == ["sglang", "vllm", "vllm-steps"]
    loaded.clear()
    monkeypatch.delenv("WORKBENCH_KV_STEP_LOG")
    boot.install()
    assert loaded == ["sglang", "vllm"]
    boot.reset()


@pytest.mark.parametrize("env", [{}, {"WORKBENCH_KV_STEP_LOG": "/tmp/steps.jsonl"}])
def test_pth_line_boots_for_the_step_log(tmp_path, env):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / pth.NAME).write_text(pth.LINE)
    base = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
    code = ("import site, sys; site.addsitedir(sys.argv[1]); "
            "print('workbench.adapters.boot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(site_dir)], env={**base, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(bool(env))]
