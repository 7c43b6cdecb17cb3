from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.labs import LABS, get_lab, run_lab
from workbench.labs.kit.record import SCHEMA

# seed 003 §12 (unified result table) and seed 000 §2 (version manifest)
TABLE_FIELDS = {"experiment_id", "hypothesis", "environment", "model_io", "cache_state", "load",
                "samples", "outcomes", "ttft", "tpot_itl", "e2e", "throughput", "slo_goodput",
                "hits", "transfer_bytes", "phase_times", "kv", "correctness", "raw_data",
                "verdict", "mechanism", "open_questions", "applicability", "manifest"}


def test_colocation_point_record_and_markdown():
    lab = get_lab("colocation")
    res = run_lab("colocation", lab.params(peaks=(12,), workers=1), "sim")
    rec, md = res.record, res.markdown
    assert res.tables["points"] == rec.results["points"]
    try:
        import plotly  # noqa: F401

        (trace_names,) = [[t.name for t in f.data] for f in res.figures.values()]
        assert trace_names == ["mean static", "mean elastic", "p99 static", "p99 elastic"]
    except ImportError:
        assert res.figures == {}
    d = json.loads(rec.to_json())
    assert d["schema"] == SCHEMA and TABLE_FIELDS <= set(d)
    assert set(d["manifest"]) == {"hardware", "software", "engine_config", "kvcached_config"}
    assert d["manifest"]["kvcached_config"]["page_size"] == 2 << 20
    (p,) = d["results"]["points"]
    assert p["peak"] == 12 and p["kvcached"]["mean_static"] == 94
    assert p["mean_ttft_ms"]["static"] > 0 and p["mean_speedup"] > 0
    assert "| 12 |" in md and "Why ours differs" in md
    assert d["results"]["timelines"]["12/elastic"]["vllm0"]["mapped_bytes"]


def test_cli_labs_list_and_run(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["labs", "list"])
    assert out.exit_code == 0 and "colocation" in out.output
    target = tmp_path / "colo.json"
    out = runner.invoke(app, ["labs", "run", "colocation", "--peaks", "12", "--out",
                              str(target)])
    assert out.exit_code == 0, out.output
    assert json.loads(target.read_text())["results"]["points"][0]["peak"] == 12
    assert target.with_suffix(".md").exists()
    fit = runner.invoke(app, ["labs", "run", "colocation", "--peaks", "12", "--steptime",
                              "kvcached-fit"])
    assert fit.exit_code == 0 and "step_overhead_s=0.005" in fit.output
    bad_fit = runner.invoke(app, ["labs", "run", "colocation", "--steptime", "bw_eff=x"])
    assert bad_fit.exit_code == 2
    bad = runner.invoke(app, ["labs", "run", "colocation", "--backend", "banana"])
    assert bad.exit_code == 2
    assert runner.invoke(app, ["labs", "run", "nope"]).exit_code == 2


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_idle_footprint_page_aware_within_goal_and_beats_lru(engine):
    from workbench.labs.idle_footprint.sim import measure

    pa = measure(engine, page_aware=True, num_requests=400)
    lru = measure(engine, page_aware=False, num_requests=400)
    assert pa["cached_blocks"] <= 1000 and lru["cached_blocks"] <= 1000
    assert pa["ratio_in_use"] <= 1.15 < lru["ratio_in_use"]
    assert pa["prefix_hit_tokens"] > 0


def test_every_lab_follows_the_protocol():
    from workbench.labs.kit.base import Lab

    for name in LABS:
        lab = get_lab(name)
        assert isinstance(lab, Lab) and lab.name == name
        # every lab runs anywhere: on sim, or on host (the CPU) when it needs real tokens
        assert "sim" in lab.backends or "host" in lab.backends
        assert lab.params() == lab.params_type()  # every parameter has a default


def test_params_parse_from_text_by_field_type():
    lab = get_lab("colocation")
    p = lab.parse_params({"peaks": "12,14", "quick": "true", "seed": "3", "workers": "none",
                          "time_scale": "2.5"})
    assert (p.peaks, p.quick, p.seed, p.workers, p.time_scale) == ((12, 14), True, 3, None, 2.5)
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="not one of its parameters"):
        lab.parse_params({"banana": "1"})
    with pytest.raises(ConfigError, match="seed=x: not an integer"):
        lab.parse_params({"seed": "x"})


@pytest.mark.parametrize("lab,backend,why", [
    ("chunked-prefill", "gpu", "is not supported by this lab"),
    ("idle-footprint", "banana", "unknown device name"),
    ("colocation", "banana", "unknown device name"),
])
def test_cli_refuses_a_backend_in_one_line_and_writes_no_record(tmp_path, lab, backend, why):
    import subprocess
    import sys

    target = tmp_path / "rec.json"
    out = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", lab, "--backend",
                          backend, "--out", str(target)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and lines[0].startswith("error: ")
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert not target.exists() and not target.with_suffix(".md").exists()


def test_cli_refuses_gpu_colocation_where_no_gpu_is_usable(tmp_path):
    from workbench.backends import probe

    if probe("gpu")[0]:
        pytest.skip("a CUDA GPU is usable here")
    import subprocess
    import sys

    target = tmp_path / "rec.json"
    out = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", "colocation",
                          "--backend", "gpu", "--out", str(target)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and not target.exists()
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: backend 'gpu': ") and "use --backend sim" in line
    assert "Traceback" not in out.stderr


def test_text_params_round_trip_by_field_type():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    lab = get_lab("colocation")

    @settings(max_examples=60, deadline=None)
    @given(peaks=st.lists(st.integers(1, 10_000), min_size=1, max_size=6),
           quick=st.booleans(), seed=st.integers(0, 2**31),
           scale=st.floats(0.01, 1e3, allow_nan=False), steptime=st.sampled_from(
               ["roofline", "kvcached-fit", "bw_eff=0.5"]))
    def check(peaks, quick, seed, scale, steptime):
        p = lab.parse_params({"peaks": ",".join(map(str, peaks)), "quick": str(quick),
                              "seed": str(seed), "time_scale": repr(scale),
                              "steptime": steptime})
        assert p == lab.params(peaks=tuple(peaks), quick=quick, seed=seed, time_scale=scale,
                               steptime=steptime)

    check()
