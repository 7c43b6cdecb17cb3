"""tp-pp (seed 000 §11): a failed map leaves no rank mapped, PP stages are separate namespaces
and ``pp_rank = -1`` reaches them all, a retired page waits for every worker's barrier, and the
round trips per op. Each claim is read from the workers' own state, on simulated workers and on
real worker processes (host memory)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.labs.cli import run_lab_cli
from workbench.errors import ConfigError
from workbench.labs import run_lab
from workbench.labs.kit import tp_pp_workers
from workbench.labs.kit.tp_pp_workers import GEO
from workbench.labs.tp_pp.lab import TpPpParams
from workbench.labs.tp_pp.real import (
    async_release,
    local_pools_contrast,
    pp_namespaces,
    round_trips,
    tp_all_or_nothing,
)
from workbench.labs.tp_pp.report import checks

pytestmark = pytest.mark.usefixtures("socket_base")

BACKENDS = ["sim", "host"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_map_failing_on_one_rank_leaves_no_rank_mapped(backend):
    d = tp_all_or_nothing(backend, 2)
    assert d["mapped_after_ok_map"] == {"pp0/tp0": [0, 1], "pp0/tp1": [0, 1]}
    assert d["alloc_refused"] and d["victim"] == "pp0/tp1"
    assert d["mapped_after_failed_map"] == {"pp0/tp0": [0, 1], "pp0/tp1": [0, 1]}
    two_pages = 2 * GEO.page_id_bytes
    assert d["held_before"] == d["held_after"] == {"pp0/tp0": two_pages, "pp0/tp1": two_pages}
    assert d["page2_state"] == "free" and not d["pool_failed"]
    assert "page 2: free -> free (map_rollback)" in d["events"]
    # rank 0 got an UNMAP of the page it had newly mapped; rank 1 did not
    labels = [(m.dst, m.label) for m in d["messages"]]
    assert ("pp0/w0", "UNMAP page 2") in labels and ("pp0/w1", "UNMAP page 2") not in labels
    assert d["retry_ok"] and d["mapped_after_retry"] == {"pp0/tp0": [0, 1, 2],
                                                         "pp0/tp1": [0, 1, 2]}
    assert not d["socket_dir_left"] and d["workers_left"] == []


def test_local_pools_touch_only_their_own_rank():
    d = local_pools_contrast(2)
    assert d["maps_after_rank0_alloc"][1] == d["maps_before"][1]
    assert d["maps_after_rank0_alloc"][0] > d["maps_before"][0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pp_stages_are_separate_namespaces(backend):
    d = pp_namespaces(backend, 2)
    assert d["socket_files"] == ["pp1/w0.sock", "w0.sock"]
    assert d["files_are_real"] is (backend == "host")
    assert d["page3_all_stages"] == {"pp0/tp0": True, "pp1/tp0": True}
    assert d["page5_stage0_only"] == {"pp0/tp0": True, "pp1/tp0": False}
    assert d["mapped_after_unmap"] == {"pp0/tp0": [], "pp1/tp0": []}
    assert d["missing_refused"].startswith("no listener for pp1/w0")
    assert d["messages_sent_when_missing"] == 0 and d["mapped_when_missing"] == {"pp0/tp0": []}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_retired_page_waits_for_every_barrier(backend):
    d = async_release(backend, 2)
    both = {"pp0/tp0": [0, 1], "pp0/tp1": [0, 1]}
    assert d["state_after_free"] == "retired" and d["mapped_after_free"] == both
    assert d["released_incomplete"] == 0 and d["state_after_incomplete"] == "retired"
    assert d["mapped_after_incomplete"] == both
    assert [m.ok for m in d["messages_incomplete"] if m.dst == "coordinator"].count(False) == 1
    assert d["released_complete"] == 1 and d["state_after_complete"] == "free"
    assert d["mapped_after_complete"] == {"pp0/tp0": [0], "pp0/tp1": [0]}
    assert any("barrier@0 -> incomplete" in e for e in d["events"]) and not d["pool_failed"]


def test_round_trips_per_op_and_alternated_order():
    d = round_trips("sim", (1, 2), pages=3, repeats=2)
    assert d["order"] == ["tp1/r0", "tp2/r0", "tp2/r1", "tp1/r1"]
    rows = {r["tp"]: r for r in d["rows"]}
    assert rows[1]["ops"] == rows[2]["ops"] == 6
    assert rows[1]["map_round_trips"] == rows[2]["map_round_trips"] == [1]
    assert rows[1]["unmap_round_trips"] == [1] and rows[2]["unmap_round_trips"] == [2]
    assert rows[1]["messages_per_unmap"] == {"prepare": 1, "commit": 0}
    assert rows[2]["messages_per_unmap"] == {"prepare": 2, "commit": 2}
    assert rows[2]["unmap_us_p50"] > rows[1]["unmap_us_p50"]  # the second round trip costs


@pytest.fixture(scope="module")
def sim_result():
    return run_lab("tp-pp", TpPpParams(quick=True), "sim")


def test_checks_are_not_vacuous(sim_result):
    """The lab's checks fail on the data a broken protocol would give."""
    data = sim_result.record.results
    data = {k: data[k] for k in ("tp", "local", "pp", "async", "round_trips")}
    assert all(checks(data).values())
    partial = copy.deepcopy(data)
    partial["tp"]["mapped_after_failed_map"]["pp0/tp0"].append(2)
    eager = copy.deepcopy(data)
    eager["async"]["released_incomplete"] = 1
    leaky = copy.deepcopy(data)
    leaky["pp"]["socket_dir_left"] = True
    assert not checks(partial)["tp_all_or_nothing"]
    assert not checks(eager)["async_barrier"]
    assert not checks(leaky)["cleanup"]


def test_lab_record_and_cli(sim_result, tmp_path):
    d = json.loads(sim_result.record.to_json())
    assert d["verdict"] == "supported" and d["kv"]["checks"]["round_trips"] is True
    assert d["results"]["messages"]["unmap"]["2"][4]["label"].startswith("PREPARE page 1")
    assert "| check | the seed expects | measured here | holds |" in sim_result.markdown
    assert run_lab_cli(tmp_path / "t.json", "tp-pp", "--quick")["verdict"] == "supported"


def test_gpu_refused_with_fewer_gpus_than_ranks(monkeypatch):
    monkeypatch.setattr(tp_pp_workers, "cuda_device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"needs one GPU per rank \(2 ranks\) and this host "
                                          r"shows 1"):
        tp_pp_workers.need_gpus("tp-pp", "gpu", 2)
    tp_pp_workers.need_gpus("tp-pp", "host", 8)  # only gpu needs GPUs
    tp_pp_workers.need_gpus("tp-pp", "gpu", 2, gpus=1)  # ranks asked to share one GPU
    with pytest.raises(ConfigError, match="asked to spread its ranks over 2 GPUs"):
        tp_pp_workers.need_gpus("tp-pp", "gpu", 3, gpus=2)


@pytest.mark.parametrize("gpus", [0, 3, -1])
def test_gpus_outside_one_to_ranks_is_refused_on_every_backend(gpus):
    why = "the lab runs 2 ranks at once" if gpus > 0 else "outside 1..8"  # 0, -1: its range
    with pytest.raises(ConfigError, match=f"gpus={gpus}: {why}"):
        run_lab("tp-pp", TpPpParams(quick=True, gpus=gpus), "sim")


def test_placement_says_when_ranks_share_a_gpu():
    assert "one CUDA GPU per rank" in tp_pp_workers.placement("gpu", None)
    shared = tp_pp_workers.placement("cuda:0", 1)
    assert "sharing 1 CUDA GPU" in shared and "not the one-GPU-per-rank setup" in shared


@pytest.mark.parametrize(("values", "what"), [({"pages": 16}, "pages=16"),
                                              ({"tp": 1}, "tp=1: outside 2..8")])
def test_params_out_of_range_are_refused(values, what):
    with pytest.raises(ConfigError, match=what):
        run_lab("tp-pp", TpPpParams(quick=True, **values), "sim")


def test_run_lab_checks_the_backend_with_the_params_it_runs(monkeypatch):
    """gpus=1 on a one-GPU host passes the check before the run; the defaults do not."""
    from workbench.labs.tp_pp.lab import TpPpLab

    monkeypatch.setattr(tp_pp_workers, "cuda_device_count", lambda: 1)
    monkeypatch.setattr("workbench.backends.require", lambda backend: None)
    seen = []
    runner = lambda p, run, progress=None: seen.append(p.gpus)  # noqa: E731
    monkeypatch.setattr(TpPpLab, "runners", {f: runner for f in TpPpLab.runners})
    run_lab("tp-pp", TpPpParams(quick=True, gpus=1), "gpu")
    assert seen == [1]
    with pytest.raises(ConfigError, match=r"needs one GPU per rank \(2 ranks\)"):
        run_lab("tp-pp", TpPpParams(quick=True), "gpu")
    assert seen == [1]
