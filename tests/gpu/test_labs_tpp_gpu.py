"""The tp-pp and faults labs on the gpu backend (``make test-gpu``): one worker process per rank,
each mapping its own pages with CUDA VMM. One GPU per rank needs two GPUs (with fewer the labs
refuse in one line, which is checked where that is the case); ``gpus=1`` runs both ranks'
processes on one GPU, which every GPU host can do."""

from __future__ import annotations

import pytest

from workbench.backends import cuda_device_count, probe
from workbench.errors import ConfigError
from workbench.labs import run_lab
from workbench.labs.faults.lab import FaultsParams
from workbench.labs.tp_pp.lab import TpPpParams

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("socket_base")]


def _gpus() -> int:
    ok, why = probe("gpu")
    if not ok:
        pytest.skip(why)
    return cuda_device_count()


@pytest.mark.timeout(600)
def test_tp_pp_lab_on_two_gpus():
    if _gpus() < 2:
        pytest.skip("needs two GPUs (one per rank)")
    res = run_lab("tp-pp", TpPpParams(quick=True), "gpu")
    print(res.markdown)
    assert res.record.verdict == "supported", res.record.kv
    rows = {r["tp"]: r for r in res.tables["round_trips"]}
    assert rows[1]["unmap_round_trips"] == [1] and rows[2]["unmap_round_trips"] == [2]


@pytest.mark.timeout(600)
def test_faults_lab_on_two_gpus():
    if _gpus() < 2:
        pytest.skip("needs two GPUs (one per rank)")
    res = run_lab("faults", FaultsParams(quick=True), "gpu")
    print(res.markdown)
    assert res.record.verdict == "supported", res.record.kv
    killed = res.record.results["cases"]["killed-process"]
    assert killed["victim_exit_code"] == -9 and killed["other_instance_ok"]


def test_one_gpu_is_refused_in_one_line():
    if _gpus() >= 2:
        pytest.skip("this host has two GPUs: nothing to refuse")
    with pytest.raises(ConfigError, match="needs one GPU per rank"):
        run_lab("tp-pp", TpPpParams(quick=True), "gpu")


@pytest.mark.timeout(600)
def test_both_labs_with_ranks_sharing_one_gpu():
    _gpus()
    res = run_lab("tp-pp", TpPpParams(quick=True, gpus=1), "gpu")
    print(res.markdown)
    assert res.record.verdict == "supported", res.record.kv
    assert "sharing 1 CUDA GPU" in res.record.manifest.hardware["device"]
    res = run_lab("faults", FaultsParams(quick=True, gpus=1), "gpu")
    print(res.markdown)
    assert res.record.verdict == "supported", res.record.kv
    killed = res.record.results["cases"]["killed-process"]
    assert killed["victim_exit_code"] == -9 and killed["other_instance_ok"]
