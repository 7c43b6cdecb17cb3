"""``workbench bench scale``: the simulator's cost curve, on points small enough for a test."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from workbench.bench.scale import ScalePoint, default_points, run_point, run_scale, summary_lines
from workbench.cli import app


def test_default_points_cover_the_issue_curve():
    pts = default_points(20, 10)
    assert [(p.instances, p.requests) for p in pts] == [
        (1, 20), (3, 20), (16, 20), (64, 20), (1, 200), (3, 200), (16, 200)]


def test_a_point_is_deterministic_per_seed_and_finishes_every_request():
    p = ScalePoint(2, 4)
    a, b = run_point(p, seed=1), run_point(p, seed=1)
    assert (a["sim_s"], a["steps"], a["requests"]) == (b["sim_s"], b["steps"], b["requests"])
    assert a["requests"] == 8 and a["steps"] > 0 and a["sim_s"] > 0
    assert a["sim_per_cpu"] == a["sim_s"] / a["cpu_s"]


def test_more_instances_are_more_steps_for_the_same_trace_length():
    one, four = run_point(ScalePoint(1, 4)), run_point(ScalePoint(4, 4))
    assert four["steps"] > 3 * one["steps"]


def test_run_scale_reports_median_and_spread_per_point():
    res = run_scale([ScalePoint(1, 3), ScalePoint(2, 3)], repeats=3)
    assert res["repeats"] == 3 and len(res["points"]) == 2
    for row in res["points"]:
        s = row["sim_per_cpu"]
        assert len(s["runs"]) == 3
        assert s["median"] == sorted(s["runs"])[1]
        assert s["min"] == min(s["runs"]) and s["max"] == max(s["runs"])
    lines = summary_lines(res)
    assert len(lines) == 2 and lines[1].startswith("scale instances=  2 req/inst=   3")


def test_cli_writes_the_record(tmp_path):
    out = tmp_path / "scale.json"
    r = CliRunner().invoke(app, ["bench", "scale", "--repeats", "1", "--requests", "2",
                                 "--longer", "2", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    rec = json.loads(out.read_text())
    assert [p["instances"] for p in rec["points"]] == [1, 3, 16, 64, 1, 3, 16]
    assert [p["requests_per_instance"] for p in rec["points"]] == [2, 2, 2, 2, 4, 4, 4]
    bad = CliRunner().invoke(app, ["bench", "scale", "--repeats", "0"])
    assert bad.exit_code == 2
