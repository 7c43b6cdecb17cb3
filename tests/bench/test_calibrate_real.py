"""The real-engine calibration: synthetic step logs and records made by a known step-time model
are recovered; bad log lines are refused in one line with their number; the fitted profile lands
in hardware.py's block with its provenance and nothing else in the file changes."""

from __future__ import annotations

import gzip
import json
import random
import shutil

import pytest

from workbench.bench import calibrate, profiles, steprows
from workbench.bench.steprows import Step, Workload
from workbench.engines.sim.steptime import StepTimeModel

TRUE = {"flops_eff": 0.55, "bw_eff": 0.75, "step_overhead_s": 3e-3, "seq_overhead_s": 2e-5,
        "prefill_overhead_s": 4e-3}
MODEL = StepTimeModel.preset("llama-3.1-8b", "h200", **TRUE)


def _steps(n: int, seed: int = 0, ctx: bool = True, t0: float = 1000.0) -> list[dict]:
    """Decode-only steps of 1-128 seqs and steps with a prefill chunk of up to 2048 tokens."""
    rng, t, out = random.Random(seed), t0, []
    for _ in range(n):
        seqs = rng.randint(1, 128)
        pre = rng.choice([0, 0, 0, rng.randint(16, 2048)])
        dec = seqs - (1 if pre else 0)
        c = dec * rng.randint(256, 512)
        pairs = c + dec + pre * (pre + 1) / 2
        dur = MODEL.step_time(seqs, pre + dec, c, pairs)
        d = {"t": round(t, 6), "dur_s": round(dur, 7), "prefill_tokens": pre,
             "decode_tokens": dec, "seqs": seqs}
        if ctx:
            d |= {"ctx_tokens": c, "attn_pairs": round(pairs)}
        out.append(d)
        t += dur + rng.choice([0.0, 0.002])
    return out


@pytest.fixture
def hw(tmp_path):
    path = tmp_path / "hardware.py"
    shutil.copy(profiles.DEFAULT, path)
    return path


def _fields(hw, name):
    return profiles.read_profiles(hw)[name]["fields"]


def _close(got: dict) -> None:
    for k in ("flops_eff", "bw_eff"):
        assert got[k] == pytest.approx(TRUE[k], abs=0.012), k
    for k in ("step_overhead_s", "seq_overhead_s", "prefill_overhead_s"):
        assert got[k] == pytest.approx(TRUE[k], rel=0.08), k


def test_a_known_model_is_recovered_from_step_logs(tmp_path, hw, capsys):
    log = tmp_path / "steps-0.jsonl"
    log.write_text("".join(json.dumps(d) + "\n" for d in _steps(1500)))
    assert calibrate.main([str(log), "--name", "synthetic", "--hardware", str(hw),
                           "--machine", "made up", "--engine-version", "none"]) == 0
    out = capsys.readouterr().out
    assert "all: 1500 steps, relative error median 0.0%" in out
    _close(_fields(hw, "synthetic"))
    prov = profiles.read_profiles(hw)["synthetic"]["provenance"]
    assert prov["steps_used"] == 1500 and prov["machine"] == "made up"
    assert prov["context"] == "logged" and prov["p90_rel_err"] < 0.01
    assert "/" not in prov["command"]  # no machine path lands in the repository


def test_a_record_without_context_fits_on_its_chosen_repeat(tmp_path, hw, capsys):
    # the record keeps the five core fields; context is estimated from the workload
    def point(seed):
        eng = []
        for i in range(3):  # three engines, far apart in time: every step solo
            rows = _steps(300, seed + i, ctx=False, t0=1e4 * (i + 1))
            for d in rows:  # what the estimate assumes: decodes at prompt + output / 2
                d["dur_s"] = MODEL.step_time(d["seqs"], d["prefill_tokens"] + d["decode_tokens"],
                                             d["decode_tokens"] * 320,
                                             d["decode_tokens"] * 321 +
                                             d["prefill_tokens"] * 128.5)
            t0 = rows[0]["t"]
            eng.append({"t0": t0, "fields": list(steprows.CORE),
                        "rows": [[d["t"] - t0, d["dur_s"], d["prefill_tokens"],
                                  d["decode_tokens"], d["seqs"]] for d in rows]})
        return {"overall": {}, "steps": eng}

    reps = [{"repeat": r, "device": "Sim H200", "vllm_version": "0.26.0",
             "config": {"model": "llama-3.1-8b", "prompt_len": 256, "completion_len": 512,
                        "time_scale": 4.0},
             "runs": {"2/static": point(10 * r)}} for r in range(2)]
    reps[1]["runs"]["2/static"]["steps"][0]["rows"][0][1] = 5.0  # a wild step in repeat 1
    rec = tmp_path / "record.json.gz"
    rec.write_bytes(gzip.compress(json.dumps({"repeats": reps}).encode()))
    assert calibrate.main([str(rec), "--repeats", "0", "--name", "rec", "--hardware",
                           str(hw)]) == 0
    prof = profiles.read_profiles(hw)["rec"]
    _close(prof["fields"])
    assert prof["provenance"]["steps_used"] == 900 and prof["provenance"]["steps_dropped"] == 0
    assert prof["provenance"]["context"].startswith("estimated (prompt 256, output 128)")
    assert prof["provenance"]["machine"] == "Sim H200"
    assert prof["provenance"]["engine"] == "vllm 0.26.0"
    assert prof["provenance"]["fitted_on"]["points"] == ["r0 2/static (900)"]


@pytest.mark.parametrize("line, why", [
    ("{not json", "is not JSON"),
    ('{"t": 1, "dur_s": 0.1, "prefill_tokens": 3, "seqs": 1}', "decode_tokens is missing"),
    ('{"t": 1, "dur_s": -0.1, "prefill_tokens": 3, "decode_tokens": 0, "seqs": 1}',
     "dur_s is not a number >= 0"),
    ('{"t": 1, "dur_s": NaN, "prefill_tokens": 3, "decode_tokens": 0, "seqs": 1}', "not JSON"),
    ('{"t": 1, "dur_s": 0.1, "prefill_tokens": 2.5, "decode_tokens": 0, "seqs": 1}',
     "not a whole count"),
    ('{"t": 1, "dur_s": 0.1, "prefill_tokens": true, "decode_tokens": 0, "seqs": 1}',
     "prefill_tokens is not a number"),
    ('{"t": 1, "t": 2, "dur_s": 0.1, "prefill_tokens": 1, "decode_tokens": 0, "seqs": 1}',
     "appears twice"),
    ("[1, 2]", "is not a JSON object"),
])
def test_a_malformed_line_is_refused_with_its_number(tmp_path, hw, capsys, line, why):
    good = [json.dumps(d) for d in _steps(3)]
    log = tmp_path / "bad.jsonl"
    log.write_text("\n".join(good[:2] + [line] + good[2:]) + "\n")
    assert calibrate.main([str(log), "--name", "x", "--hardware", str(hw)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl line 3" in err and why in err
    assert "x" not in profiles.read_profiles(hw)  # nothing written


def test_bad_options_are_one_line(tmp_path, hw, capsys):
    log = tmp_path / "s.jsonl"
    log.write_text(json.dumps(_steps(1)[0]) + "\n")
    for extra in (["--name", "no/slash"], ["--repeats", "a"], ["--gpu", "tpu"]):
        assert calibrate.main([str(log), *extra, "--hardware", str(hw)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_async_steps_put_a_prefills_host_cost_on_the_period_before(tmp_path, hw):
    # async scheduling: step k+1 is scheduled as step k-1's output is processed, and its
    # host cost (a prefill's eager launch) delays step k's end
    rng, steps, ends = random.Random(3), [], [1000.0, 1000.0]
    shapes = [(rng.randint(1, 64), rng.random() < 0.2) for _ in range(1200)]
    for k, (seqs, pre) in enumerate(shapes):
        p = 256 * rng.randint(1, 3) if pre else 0
        dec, c = seqs, seqs * 300
        pairs = c + dec + p * (p + 1) / 2
        cost = MODEL.cost(seqs + (1 if p else 0), p + dec, c, pairs)
        nxt = shapes[k + 1][1] if k + 1 < len(shapes) else False
        period = cost.gpu_s + MODEL.step_overhead_s + MODEL.seq_overhead_s * (seqs + bool(p)) \
            + (MODEL.prefill_overhead_s if nxt else 0.0)
        t = ends[-2]
        ends.append(ends[-1] + period)
        steps.append({"t": t, "dur_s": ends[-1] - t, "prefill_tokens": p, "decode_tokens": dec,
                      "seqs": seqs + (1 if p else 0), "ctx_tokens": c, "attn_pairs": pairs})
    log = tmp_path / "async.jsonl"
    log.write_text("".join(json.dumps(d) + "\n" for d in steps))
    assert steprows.is_async(steprows.read_log(log))
    assert calibrate.main([str(log), "--name", "async", "--hardware", str(hw)]) == 0
    _close(_fields(hw, "async"))


def test_own_time_and_solo_steps():
    # async scheduling: the second step was scheduled before the first was processed
    a = [Step(0.0, 1.0, 8, 0, 1, 0, 36), Step(0.5, 1.0, 0, 1, 1, 8, 9),
         Step(3.0, 0.5, 0, 1, 1, 9, 10)]
    assert steprows.own_times(a) == [1.0, 0.5, 0.5]
    b = [Step(1.2, 0.1, 0, 1, 1, 5, 6)]  # inside a's second step only
    assert steprows.solo_mask([a, b]) == [[True, False, True], [False]]
    rows = steprows.fit_rows([a, b], None)
    assert [r[4] for r in rows] == [1.0, 0.5]
    assert [r[5] for r in rows] == [1.0, 0.0]  # not async: a prefill's cost is its own step's
    assert len(steprows.fit_rows([a, b], None, solo=False)) == 4
    with pytest.raises(ValueError, match="need the workload's lengths"):
        steprows.fit_rows([[Step(0.0, 1.0, 8, 0, 1)]], None)


def test_context_estimate_of_a_workload():
    wl = Workload(256, 128)
    s = Step(0.0, 0.1, 256, 3, 4)
    assert wl.ctx(s) == 3 * 320 and wl.pairs(s) == 3 * 321 + 256 * 128.5


def test_profile_block_round_trip_keeps_the_rest_of_the_file(hw):
    before = hw.read_text()
    prof = {"gpu": "h200", "model": "llama-3.1-8b", "fields": dict(TRUE),
            "provenance": {"command": "python -m workbench.bench.calibrate " + "x.jsonl " * 30}}
    profiles.write_profile("b-one", prof, hw)
    profiles.write_profile("a-two", prof, hw)
    after = hw.read_text()
    existing = set(profiles.read_profiles(profiles.DEFAULT))
    assert list(profiles.read_profiles(hw)) == sorted(existing | {"a-two", "b-one"})
    assert profiles.read_profiles(hw)["a-two"] == prof
    assert max(map(len, after.splitlines())) <= 100
    head, tail = before.split(profiles.BEGIN)[0], before.split(profiles.END)[1]
    assert after.startswith(head + profiles.BEGIN) and after.endswith(profiles.END + tail)
    compile(after, "hardware.py", "exec")


def test_a_prefills_gpu_share_is_read_from_decodes_beside_it():
    # engine A decodes 8 ms periods alone, 12 ms while B is in its 60 ms prefill period
    a, b, t = [], [], 0.0
    for k in range(200):
        beside = k % 2 == 1
        if beside:
            b.append(Step(t, 0.06, 256, 0, 1, 0, 256 * 257 / 2))
            for _ in range(5):
                a.append(Step(t, 0.012, 0, 4, 4, 1200, 1204))
                t += 0.012
        else:
            for _ in range(5):
                a.append(Step(t, 0.008, 0, 4, 4, 1200, 1204))
                t += 0.008
        t += 0.001
    share = steprows.prefill_gpu_share([[a, b]])
    assert share["base_s"] == pytest.approx(0.008) and share["beside_s"] == pytest.approx(0.012)
    assert share["gpu_s"] == pytest.approx(0.004 * 0.06 / 0.012)  # 20 ms of B's 60 ms
    assert steprows.prefill_gpu_share([[a]]) is None


def test_the_gpu_share_of_a_prefill_holds_the_gpu_in_the_model():
    host = StepTimeModel.preset("llama-3.1-8b", "h200", **TRUE)
    half = StepTimeModel.preset("llama-3.1-8b", "h200", **TRUE, prefill_gpu_frac=0.5)
    a, b = host.cost(2, 257, 0, 257 * 129), half.cost(2, 257, 0, 257 * 129)
    assert b.total_s == pytest.approx(a.total_s)
    assert b.gpu_s - a.gpu_s == pytest.approx(TRUE["prefill_overhead_s"] / 2)
    assert half.cost(4, 4, 1200, 1204) == host.cost(4, 4, 1200, 1204)  # decode unchanged
