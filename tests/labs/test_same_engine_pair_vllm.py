"""same-engine-pair on a real vLLM: the report from a canned run (no vLLM needed), the lab's
engine check and dispatch, and the sim run left as it was."""

from __future__ import annotations

import copy

import pytest

from workbench.engines.real import vllm as kind
from workbench.errors import ConfigError
from workbench.labs import get_lab
from workbench.labs.same_engine_pair import server as pair_vllm
from workbench.labs.same_engine_pair.report import EXPECT, real_checks, vllm_report
from workbench.units import MiB

BUDGET = 20 * MiB


def _row(t, phase, a, b, holders=None):
    holders = holders or {}
    return {"t": t, "phase": phase, "A": None if a is None else a * MiB, "B": b * MiB,
            "A_used": 1, "B_used": 1,
            "total": BUDGET, "held": sum(holders.values()) * MiB,
            "holders": {k: v * MiB for k, v in holders.items()}, "free": 10 << 30}


def _budget(a, b):
    return {"rc": 0, "budgets": {"host": {"total": BUDGET, "held": (a + b) * MiB,
                                          "free": BUDGET - (a + b) * MiB, "holders": [
        {"pid": 11, "alive": True, "held": a * MiB}, {"pid": 21, "alive": True,
                                                     "held": b * MiB}]}}}


def canned() -> dict:
    h = lambda a, b: {"11": a, "21": b}  # noqa: E731 - the engine-core pids of A and B
    samples = [_row(0.0, "idle", 4, 4, h(4, 4)), _row(1.0, "A", 12, 4, h(12, 4)),
               _row(2.0, "A", 16, 4, h(16, 4)), _row(3.0, "A drained", 4, 4, h(4, 4)),
               _row(4.0, "B", 4, 16, h(4, 16)), _row(5.0, "B drained", 4, 4, h(4, 4))]
    return {"backend": "host", "device": "cpu", "budget": BUDGET, "page_id_bytes": 4 * MiB,
            "in_flight": 12, "max_tokens": 96, "phase_s": 12.0, "phases": ["idle", "A", "B"],
            "pids": {"A": [10, 11], "B": [20, 21]}, "requests": {"A": 30, "B": 30},
            "finished": {"A": 30, "B": 30}, "lost": [],
            "counters": {"A": {"num_preemptions": 3.0}, "B": {"num_preemptions": 2.0}},
            "kvctl_budget": {"idle": _budget(4, 4), "A": _budget(16, 4), "B": _budget(4, 16)},
            "samples": samples}


def test_a_run_where_b_maps_what_a_released_is_supported():
    rec, md = vllm_report(canned())
    assert rec.verdict.startswith("supported"), rec.verdict
    assert rec.environment["engine"] == "vllm" and "A peaked 16 MiB" in rec.outcomes["headline"]
    assert "| the seed expects | the real engine did |" in md
    for _, text, _ in EXPECT:  # the sim report's expectation text, beside the real result
        assert text in md
    assert "60/60 finished in full" in md and "A 3, B 2" in md
    phases = {r["phase"]: r for r in rec.results["phases"]}
    assert phases["A"]["A_peak_mib"] == 16 and phases["A"]["A_end_mib"] == 4
    assert phases["B"]["B_peak_mib"] == 16


@pytest.mark.parametrize("harm, broken", [
    (lambda o: o["samples"][2].update(held=BUDGET + 2 * MiB), "never_above_budget"),
    (lambda o: o["samples"][2].update(A=18 * MiB), "never_above_budget"),
    (lambda o: o.update(lost=["timeout"]), "no_request_lost"),
    (lambda o: o["finished"].update(B=29), "no_request_lost"),
    (lambda o: o["samples"][3].update(A=16 * MiB), "C_first_gives_back"),
    (lambda o: o["samples"][4].update(B=4 * MiB), "C_second_grows_into_freed"),
    (lambda o: o["samples"][1].update(B=8 * MiB), "B_second_flat"),
    (lambda o: o["kvctl_budget"]["A"]["budgets"]["host"]["holders"].append(
        {"pid": 99, "alive": True, "held": MiB}), "holders_are_the_engines"),
])
def test_each_broken_claim_fails_its_own_check(harm, broken):
    out = copy.deepcopy(canned())
    harm(out)
    rec, _ = vllm_report(out)
    failed = [k for k, ok in rec.kv["checks"].items() if not ok]
    assert failed == [broken] and rec.verdict.startswith("refuted"), (failed, rec.verdict)


def test_the_both_busy_phase_must_reach_the_budget():
    out = canned()
    out["phases"].append("both")
    out["samples"].append(_row(6.0, "both", 10, 10, {"11": 10, "21": 10}))
    from workbench.labs.same_engine_pair.report import _phase_rows

    alone = {"p50": 50.0, "p99": 90.0}
    out["ttft_ms"] = {"A": {"A": alone}, "B": {"B": alone},
                      "both": {"A": {"p50": 70.0, "p99": 200.0}, "B": {"p50": 60.0, "p99": 150.0}}}
    assert real_checks(out, _phase_rows(out))["D_at_budget"]
    assert real_checks(out, _phase_rows(out))["D_slower_than_alone"]
    rec, md = vllm_report(out)
    assert rec.verdict.startswith("supported") and "A 90 ms alone -> 200 ms both" in md
    out["ttft_ms"]["both"]["B"]["p99"] = 80.0
    assert not real_checks(out, _phase_rows(out))["D_slower_than_alone"]
    out["samples"][-1] = _row(6.0, "both", 6, 6, {"11": 6, "21": 6})
    assert not real_checks(out, _phase_rows(out))["D_at_budget"]


def test_engine_vllm_dispatches_to_the_real_runner_and_sim_stays(monkeypatch):
    lab = get_lab("same-engine-pair")
    assert lab.backends == ("sim", "host", "gpu")
    monkeypatch.setattr(kind, "vllm_python", lambda: "/fake/python")
    monkeypatch.setattr(pair_vllm, "run", lambda backend, quick=False, kind="vllm": canned())
    lab.check_backend("host", lab.params(engine="vllm"))
    res = lab.run(lab.parse_params({"engine": "vllm", "quick": "true"}), "host")
    assert res.record.experiment_id == "same-engine-pair" and res.record.raw_data["wall_s"] >= 0
    lab.check_backend("sim", lab.params())  # on sim: the simulated engines, as before
    lab.check_backend("sim", lab.params(kind="sglang"))
    with pytest.raises(ConfigError, match="kind='sglang' on backend 'host'"):
        lab.check_backend("host", lab.params(kind="sglang"))
    with pytest.raises(ConfigError, match="engine=sglang on backend 'host'"):  # gpu only
        lab.check_backend("host", lab.params(engine="sglang"))


def test_without_vllm_the_lab_stops_in_one_line(monkeypatch):
    from workbench.labs import run_lab

    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", "/nonexistent/python")
    lab = get_lab("same-engine-pair")
    with pytest.raises(ConfigError) as err:
        run_lab("same-engine-pair", lab.params(engine="vllm", quick=True), "host")
    assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)


def test_a_graceful_exit_returns_the_first_engines_bytes_and_the_other_grows():
    from workbench.labs.same_engine_pair.report import _phase_rows

    out = canned()
    out["phases"] += ["both", "E"]
    out["samples"] += [_row(6.0, "both", 12, 8, {"11": 12, "21": 8}),
                       _row(7.0, "E", None, 16, {"21": 16}),
                       _row(8.0, "E drained", None, 4, {"21": 4})]
    out["kvctl_budget"]["E"] = _budget(0, 16)
    got = real_checks(out, _phase_rows(out))
    assert got["E_first_released_all"] and got["E_second_grows_past_D"], got
    _, md = vllm_report(out)
    assert "its segment gone, its budget slot still held 0 MiB after the exit" in md
    assert "B 8 MiB in D -> 16 before" in md


def test_a_dead_engines_slot_left_held_refutes_E_and_gc_is_reported():
    """The exit the real run showed: A's engine core killed, its 4 MiB slot still held by a
    dead pid; B stuck at its share of D until ``kvctl budget --gc`` reclaimed the slot."""

    out = canned()
    out["phases"] += ["both", "E"]
    out["samples"] += [_row(6.0, "both", 4, 16, {"11": 4, "21": 16}),
                       _row(7.0, "E", None, 16, {"11": 4, "21": 16}),
                       _row(8.0, "E after gc", None, 20, {"21": 20}),
                       _row(9.0, "E drained", None, 4, {"21": 4})]
    out["kvctl_budget"]["E"] = _budget(4, 16)
    gc = _budget(0, 16)
    gc["budgets"]["host"]["reclaimed"] = 4 * MiB
    out["kvctl_budget"]["E gc"] = gc
    rec, md = vllm_report(out)
    failed = [k for k, ok in rec.kv["checks"].items() if not ok]
    assert failed == ["E_first_released_all"], failed
    assert "slot still held 4 MiB after the exit" in md
    assert "16 before `kvctl budget --gc` (reclaimed 4 MiB) -> 20 after" in md
