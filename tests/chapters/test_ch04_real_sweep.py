"""Chapter 04's real sweep: the saved real-vLLM colocation record is read (not re-run), its table
and the figure beside the simulated sweep are built from it, the prose names the machine the
record names, and the saved raw repeats rebuild the same points."""

from __future__ import annotations

import json
import os

import pytest

from workbench.labs.colocation.lab import RECORDS, beside, machine, saved_record, table

from .nbrun import CHAPTERS

STEM = "04_colocation_and_limits"


def _cells(kind: str) -> list[str]:
    nb = json.loads((CHAPTERS / f"{STEM}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


def test_the_saved_record_is_found_and_names_its_machine():
    rec = saved_record()
    assert rec is not None, f"no real-vLLM record in {RECORDS}"
    who = machine(rec)
    assert "NVIDIA H200" in who and "vLLM 0.26.0" in who and "2026-12-01" in who
    assert "--param engine=vllm" in who
    pts = rec["results"]["points"]
    assert len(pts) >= 4 and all(p["repeats"] == 3 for p in pts)
    rows = table(pts, scaled=True).splitlines()
    assert len(rows) == 2 + len(pts) and all(r.count("[") == 6 for r in rows[2:])


def test_the_prose_names_the_machine_the_record_names():
    rec = saved_record()
    prose = next(t for t in _cells("markdown") if "real vLLM (a saved record)" in t)
    assert rec["results"]["device"] in prose
    assert f"vLLM {rec['environment']['vllm_version']}" in prose
    code = next(t for t in _cells("code") if "saved_record()" in t)
    assert "run_lab(" in code and "engine=vllm" not in code.replace("--param engine=vllm", "")


def test_no_record_or_a_bad_one_is_none(tmp_path):
    assert saved_record(tmp_path) is None
    assert saved_record(tmp_path / "missing") is None
    (tmp_path / "b.json").write_text(json.dumps({"environment": {"engine": "mini"},
                                                 "results": {"points": []}}))
    (tmp_path / "c.json").write_text("{not json")
    os.symlink(RECORDS / sorted(p.name for p in RECORDS.glob("*.json"))[0], tmp_path / "d.json")
    assert saved_record(tmp_path) is None


def test_the_chapter_cell_reads_the_record_and_sets_it_beside_the_sim(capsys):
    pytest.importorskip("plotly")
    pytest.importorskip("IPython")
    shown = []
    code = next(t for t in _cells("code") if "saved_record()" in t)
    import IPython.display

    real_display = IPython.display.display
    IPython.display.display = lambda *a, **k: shown.extend(a)
    try:
        exec(code, {"backend": "sim", "figure": shown.append})  # noqa: S102 - its own cell
    finally:
        IPython.display.display = real_display
    text = "".join(s.data for s in shown if isinstance(getattr(s, "data", None), str))
    assert "**Real vLLM**, made on NVIDIA H200" in text and "**Simulated**" in text
    figs = [s for s in shown if isinstance(getattr(s, "data", None), tuple)]
    assert figs and len(figs[0].data) == 4


def test_the_saved_raw_repeats_rebuild_the_records_points():
    from workbench.labs import get_lab, run_lab

    rec = saved_record()
    raw = RECORDS / rec["_path"].replace(".json", ".repeats.json.gz")  # the one beside it
    res = run_lab("colocation", get_lab("colocation").params(from_dir=str(raw)), "host")
    got = {p["peak"]: (p["mean_speedup"], p["p99_speedup"]) for p in res.tables["points"]}
    want = {p["peak"]: (p["mean_speedup"], p["p99_speedup"]) for p in rec["results"]["points"]}
    assert got == want
    steps = [s for r in json.loads(__import__("gzip").open(raw).read())
             for run in r["runs"].values() for s in run["steps"] or [] if s]
    assert steps and all(len(row) == 5 for s in steps for row in s["rows"][:3])


def test_beside_draws_both_sweeps():
    pytest.importorskip("plotly")
    pts = saved_record()["results"]["points"]
    fig = beside(pts, pts[:2])
    assert len(fig.data) == 4 and {d.xaxis for d in fig.data} == {"x", "x2"}


def test_a_sweep_cut_short_is_not_the_chapters_table(tmp_path):
    rec = json.loads((RECORDS / saved_record()["_path"]).read_text())
    (tmp_path / "a.json").write_text(json.dumps(rec))
    rec["results"]["points"][-1]["repeats"] -= 1  # a point the deadline skipped once
    (tmp_path / "b.json").write_text(json.dumps(rec))
    assert saved_record(tmp_path)["_path"] == "a.json"
