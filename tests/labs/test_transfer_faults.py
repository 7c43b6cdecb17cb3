"""transfer-faults lab (seed 003 E8): all seven rows, each criterion holds with its guard; the
unsafe control names the criteria that fail without it; one phased sequence diagram per row."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.pd.faults_store import ROWS


@pytest.fixture(scope="module")
def res():
    return run_lab("transfer-faults", get_lab("transfer-faults").params(quick=True), "sim")


def test_every_row_holds_and_its_guard_matters(res):
    rows = res.tables["rows"]
    assert [r["row"] for r in rows] == list(ROWS)
    assert all(r["passed"] for r in rows)
    assert all(r["unsafe_failed"] for r in rows)  # each guard is needed for its criterion
    by = {r["row"]: r for r in rows}
    assert by["lookup-then-gone"]["state"]["recomputed_tokens"] == 8
    assert by["store-slow"]["unsafe_failed"] == ["nothing blocks for ever"]
    assert res.record.verdict == "supported: 7/7 criteria hold with their guards"
    assert "Seed's expected result" in res.markdown


def test_a_sequence_diagram_per_row_with_fault_and_fallback(res):
    assert set(res.figures) == set(ROWS)
    msgs = res.record.raw_data["messages"]
    for row, steps in msgs.items():
        phases = [m["phase"] for m in steps]
        assert "fault" in phases, row
        assert any(not m["ok"] for m in steps), row  # the fault is drawn red
    fig = res.figures["cancel-in-flight"]
    assert any(a.text == "<i>fault</i>" for a in fig.layout.annotations)


def test_bad_rows_are_refused_and_cli_runs(tmp_path):
    lab = get_lab("transfer-faults")
    with pytest.raises(ConfigError, match=r"rows=\('disk-on-fire',\): not a list of known choices"):
        lab.run(lab.params(rows=("disk-on-fire",)))
    out = tmp_path / "tf.json"
    d = run_lab_cli(out, "transfer-faults", rows="store-slow,identity-change", unsafe="false")
    assert [x["row"] for x in d["results"]["rows"]] == ["store-slow", "identity-change"]
    assert all(x["unsafe_failed"] is None for x in d["results"]["rows"])
