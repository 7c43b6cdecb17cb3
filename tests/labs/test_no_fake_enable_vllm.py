"""no-fake-enable on a real vLLM: the report from three canned starts (no vLLM needed), each
missing piece failing exactly its check, and the lab's engine check and dispatch."""

from __future__ import annotations

import copy

import pytest

from workbench.engines.real import vllm as kind
from workbench.errors import ConfigError
from workbench.labs import get_lab
from workbench.labs.no_fake_enable import server as nfe_vllm
from workbench.labs.no_fake_enable.report import vllm_report
from workbench.labs.no_fake_enable.server import ARMS, CHECKS, EXPECTED_FAIL, interpreter
from workbench.units import MiB

APPLIED = ("INFO 12-01 23:40:01 [workbench.autopatch] workbench autopatch: vllm 0.32.0: applied "
           "elastic-block-pool, kv-tensors")


def _arm(switch: bool, pth: bool, log: list[str], segs: list[dict], argv: list[str]) -> dict:
    return {"requests": 4, "max_tokens": 48, "finished": 4, "lost": [], "pids": [10, 11],
            "ipc_name": "nfe-x" if switch else None, "segments": segs,
            "pool_mapped_mid": None, "pool_used_blocks_mid": None,
            "doctor": {"rc": 0, "config": {"autopatch_enabled": switch, "config_error": None,
                                           "pth_installed": pth},
                       "vllm": {"installed": True, "version": "0.32.0", "would_apply": 2}},
            "patch_log": log, "interpreter": argv, "elastic_env": switch}


def canned() -> dict:
    seg = {"name": "nfe-elastic-1", "owner_pid": 11, "alive": True, "mapped": 8 * MiB,
           "used_blocks": 40}
    return {"backend": "host", "device": "cpu", "start_s": 80.0,
            "kvctl_list": {"rc": 0, "stderr": "", "count": 1},
            "arms": {"elastic": _arm(True, True, [APPLIED], [seg], ["py"]),
                     "pth-skipped": _arm(True, False, [], [], ["py", "-S"]),
                     "stock": _arm(False, True, [], [], ["py"])}}


def _verdicts(rec) -> dict:
    return {(r["arm"], r["check"]): r["verdict"] for r in rec.results["checks"]}


def test_three_starts_fail_exactly_the_checks_their_missing_piece_explains():
    rec, md = vllm_report(canned())
    got = _verdicts(rec)
    for arm in ARMS:
        for c in CHECKS:
            assert got[(arm, c)] == ("FAIL" if c in EXPECTED_FAIL[arm] else "PASS"), (arm, c)
    assert rec.verdict.startswith("supported"), rec.verdict
    assert "applied elastic-block-pool" in md and "autopatch not enabled" in md
    assert "nothing listed" in md and ".pth missing" in md and "`-S`" in md
    assert rec.outcomes["headline"].startswith("elastic: all pass; pth-skipped: patch log, "
                                               "control segment; stock: autopatch switch")


@pytest.mark.parametrize("harm, arm, check", [
    (lambda o: o["arms"]["elastic"].update(patch_log=[]), "elastic", "patch log"),
    (lambda o: o["arms"]["elastic"].update(segments=[]), "elastic", "control segment"),
    (lambda o: o["arms"]["elastic"]["segments"][0].update(alive=False), "elastic",
     "control segment"),
    (lambda o: o["arms"]["elastic"]["segments"][0].update(used_blocks=0), "elastic",
     "control segment"),
    (lambda o: o["arms"]["elastic"]["doctor"]["config"].update(config_error="bad"), "elastic",
     "autopatch switch"),
    (lambda o: o["arms"]["pth-skipped"].update(patch_log=[APPLIED]), "pth-skipped",
     "patch log"),
    (lambda o: o["arms"]["stock"].update(finished=3), "stock", "served"),
])
def test_each_unexpected_piece_refutes_through_its_own_check(harm, arm, check):
    out = copy.deepcopy(canned())
    harm(out)
    rec, _ = vllm_report(out)
    wrong = [k for k, v in _verdicts(rec).items()
             if v != ("FAIL" if k[1] in EXPECTED_FAIL[k[0]] else "PASS")]
    assert wrong == [(arm, check)] and rec.verdict.startswith("refuted"), wrong


def test_a_refused_plan_shows_its_line_as_the_evidence():
    out = canned()
    out["arms"]["pth-skipped"]["patch_log"] = [
        "ERROR workbench autopatch refused to patch vllm 0.99 (1 problem); nothing was patched:"]
    rec, _ = vllm_report(out)
    row = next(r for r in rec.results["checks"] if r["arm"] == "pth-skipped"
               and r["check"] == "patch log")
    assert row["verdict"] == "FAIL" and "refused to patch" in row["evidence"]


def test_the_interpreter_is_the_servers_own():
    class E:
        class spec:  # noqa: N801 - a stand-in for VllmSpec
            server_cmd = ["/v/python", "-S", "-m", nfe_vllm.SERVER]
            python = "/v/python"

    assert interpreter(E) == ["/v/python", "-S"]
    E.spec.server_cmd = None
    assert interpreter(E) == ["/v/python"]


def test_engine_vllm_dispatches_to_the_real_runner_and_sim_stays(monkeypatch):
    lab = get_lab("no-fake-enable")
    assert lab.backends == ("sim", "host", "gpu")
    monkeypatch.setattr(kind, "vllm_python", lambda: "/fake/python")
    monkeypatch.setattr(nfe_vllm, "run", lambda backend, quick=False: canned())
    res = lab.run(lab.parse_params({"engine": "vllm", "quick": "true"}), "host")
    assert res.record.experiment_id == "no-fake-enable" and "| the seed expects |" in res.markdown
    lab.check_backend("sim", lab.params())
    with pytest.raises(ConfigError, match="engine=mini"):
        lab.params(engine="mini")


def test_without_vllm_the_lab_stops_in_one_line(monkeypatch):
    from workbench.labs import run_lab

    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", "/nonexistent/python")
    with pytest.raises(ConfigError) as err:
        run_lab("no-fake-enable", get_lab("no-fake-enable").params(engine="vllm"), "host")
    assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)
