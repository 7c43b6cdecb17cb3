"""The labs' engine=sglang runs over the SGLang stand-in server (no SGLang, no GPU needed): the
same runner code as engine=vllm with the kind named once, the record and Markdown saying SGLang,
SGLang's spec fields from the runners' shared names, and every refusal in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workbench.engines.real import sglang as sgl_kind
from workbench.engines.real.sglang import SglangEngine
from workbench.engines.real.vllm import VllmEngine
from workbench.errors import ConfigError
from workbench.labs import get_lab
from workbench.labs.kit import server_rig as rig

FAKE = [sys.executable, str(Path(__file__).parents[1] / "engines" / "real"
                            / "fake_sglang_server.py")]


@pytest.fixture
def stand_in(monkeypatch):
    """The sglang kind starts the stand-in; the runners see a CUDA device (the kind refuses the
    CPU) whose free memory is a constant."""
    monkeypatch.setitem(rig.STAND_INS, "sglang", FAKE)
    monkeypatch.setattr(rig, "device_of", lambda backend: "cuda")
    monkeypatch.setattr(rig, "device_free", lambda device: 100 << 30)
    monkeypatch.setenv("FAKE_TOKEN_S", "0.002")


def test_output_equality_on_the_sglang_kind_compares_stock_and_elastic(stand_in):
    from workbench.labs.output_equality import report
    from workbench.labs.output_equality import server as vllm

    out = vllm.run("gpu", quick=True, kind="sglang")
    assert out["engine"] == "sglang" and out["batch_invariant"]
    assert [r["case"] for r in out["rows"]] == ["greedy", "greedy, prefix hits",
                                                "seeded sampling", "greedy"]
    assert all(r["equal"] == r["prompts"] == 4 and r["lost"] == 0 for r in out["rows"])
    assert out["rows"][1]["cached_tokens"] == 0  # what SGLang says it hit (the stand-in: 0)
    assert out["engines"]["default"]["stock"] == {}  # SGLang runs without a metrics endpoint
    rec, md = report.vllm_report(out)
    assert rec.verdict.startswith("supported") and rec.environment["engine"] == "sglang"
    assert md.startswith("# Output equality (real SGLang)")
    assert "--enable-deterministic-inference" in md and "2048 token slots" in md
    # stock's small pool is what elastic's segment says its limit leaves (the stand-in
    # publishes its whole pool, 3 page ids of 8 MiB and 512 slots each, as its limit)
    assert out["small_stock_blocks"] == 1536 and "stock given the limit's 1536" in md


def test_dynamic_limit_on_the_sglang_kind_flushes_the_cache_last(stand_in):
    from workbench.labs.dynamic_limit import report
    from workbench.labs.dynamic_limit import server as vllm

    out = vllm.run("gpu", quick=True, kind="sglang")
    assert out["engine"] == "sglang" and out["finished"] == out["requests"] > 0
    names = [s["step"] for s in out["steps"]]
    assert names[0] == "halve" and names[-1] == "flush the radix cache"
    flush = out["steps"][-1]
    assert flush["flush"]["ok"] and flush["requested"] == out["steps"][0]["requested"]
    assert flush["answer"] in ("acknowledged", "pending", "superseded"), flush
    rec, md = report.vllm_report(out)
    assert md.startswith("# Dynamic limit (real SGLang)")
    assert "flushing the cache lets it converge" in md and "preemptions" not in md


def test_flush_cache_is_refused_while_requests_run(stand_in, monkeypatch, tmp_path):
    from workbench.engines.sched.request import Request

    monkeypatch.setenv("FAKE_TOKEN_S", "0.05")
    eng = rig.engine("fl", "gpu", str(tmp_path), sys.executable, tmp_path, elastic=False,
                     kind="sglang")
    with eng:
        eng.submit([Request(rid=0, prompt=[1, 2], max_new_tokens=20)])
        import time

        while not eng.requests[0].token_times:
            time.sleep(0.01)
        busy = eng.flush_cache()
        eng.advance()
        idle = eng.flush_cache()
    assert (busy["ok"], busy["status"]) == (False, 400) and idle["ok"]


def test_the_rig_renames_the_shared_fields_for_sglang(tmp_path):
    e = rig.engine("x", "sim", "m", "py", tmp_path, elastic=True, kind="sglang",
                   max_num_seqs=7, prefix_caching=False, max_total_tokens=4096)
    try:
        assert isinstance(e, sgl_kind.SglangEngine)
        assert (e.spec.max_running_requests, e.spec.radix_cache) == (7, False)
        assert e.spec.knobs["gpu_utilization"] == "0.45" and e.spec.deterministic
        a = e.spec.args(1, "x")
        assert "--enable-deterministic-inference" in a and "--disable-radix-cache" in a
    finally:
        e.close()
    off = sgl_kind.SglangSpec(model="m", deterministic=False).args(1, "x")
    assert "--enable-deterministic-inference" not in off


@pytest.mark.parametrize("lab", ["output-equality", "dynamic-limit"])
@pytest.mark.parametrize("backend", ["host", "sim"])
def test_engine_sglang_off_the_gpu_is_refused_in_one_line(lab, backend):
    the = get_lab(lab)
    if backend not in the.backends:
        pytest.skip(f"{lab} has no {backend} run")
    with pytest.raises(ConfigError, match="CUDA server only") as e:
        the.check_backend(backend, the.params(engine="sglang"))
    assert "\n" not in str(e.value) and "--backend gpu" in str(e.value)


@pytest.mark.parametrize("lab", ["idle-footprint", "kv-capacity", "no-fake-enable"])
def test_a_lab_not_built_for_sglang_refuses_it(lab):
    with pytest.raises(ConfigError, match="engine") as e:
        get_lab(lab).params(engine="sglang")
    assert "\n" not in str(e.value)


def test_a_lab_without_an_sglang_run_refuses_it_in_check_engine(monkeypatch):
    from workbench.labs.kv_capacity.params import KVCapacityParams

    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    # built by hand (past the declared range): the resolved run refuses it
    with pytest.raises(ConfigError, match="no run for that engine yet"):
        get_lab("kv-capacity").check_backend("gpu", KVCapacityParams(engine="sglang"))


def test_engine_sglang_without_sglang_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", "/nonexistent/python")
    monkeypatch.setattr(sgl_kind, "_has_sglang", lambda python: False)
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    lab = get_lab("dynamic-limit")
    with pytest.raises(ConfigError, match="needs a real SGLang") as e:
        lab.check_backend("gpu", lab.params(engine="sglang"))
    assert "\n" not in str(e.value)


def test_the_labs_route_engine_sglang_to_their_runner(monkeypatch):
    from workbench.labs.dynamic_limit import server as dl
    from workbench.labs.output_equality import server as oe

    seen = []
    monkeypatch.setattr(SglangEngine, "interpreter", classmethod(lambda cls, what: "python"))
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    for mod in (oe, dl):
        monkeypatch.setattr(mod, "run", lambda backend, quick=False, kind="vllm", runner=None:
                            seen.append(kind) or (_ for _ in ()).throw(RuntimeError("routed")))
    for lab in ("output-equality", "dynamic-limit"):
        the = get_lab(lab)
        with pytest.raises(RuntimeError, match="routed"):
            the.run(the.params(engine="sglang", quick=True), backend="gpu")
    assert seen == ["sglang", "sglang"]


def test_grow_reclaim_on_the_sglang_kind_walks_its_phases(stand_in):
    from workbench.labs.grow_reclaim import report
    from workbench.labs.grow_reclaim import server as vllm

    out = vllm.run("gpu", quick=True, kind="sglang")
    assert out["engine"] == "sglang" and [r["phase"] for r in out["phases"]][:3] == [
        "idle-0", "short", "long"]
    assert all(r["finished"] == r["requests"] for r in out["phases"])
    # a ledger block is one SGLang page of one token slot; the tiny model's slot is 16 KiB
    assert out["block_size"] == 1
    assert out["blocks_per_page"] == out["page_id_bytes"] // (16 << 10)
    _, md = report.vllm_report(out)
    assert md.startswith("# Grow and reclaim (real SGLang)") and "radix cache off" in md


def test_same_engine_pair_on_the_sglang_kind_uses_sglang_page_ids(stand_in):
    from workbench.labs.same_engine_pair import server as vllm

    out = vllm.run("gpu", quick=True, kind="sglang", phase_s=0.4)
    assert out["engine"] == "sglang" and out["page_id_bytes"] == 16 << 20
    assert out["budget"] == 5 * out["page_id_bytes"]
    assert out["phases"] == ["idle", "A", "B"] and not out["lost"]
    assert out["finished"] == out["requests"] and out["counters"] == {"A": {}, "B": {}}


def test_same_engine_pair_real_kind_must_match_the_engine(monkeypatch):
    lab = get_lab("same-engine-pair")
    monkeypatch.setattr(SglangEngine, "interpreter", classmethod(lambda cls, what: "python"))
    monkeypatch.setattr(VllmEngine, "interpreter", classmethod(lambda cls, what: "python"))
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    lab.check_backend("gpu", lab.params(engine="sglang", kind="sglang"))
    with pytest.raises(ConfigError, match="kind="):
        lab.check_backend("host", lab.params(engine="vllm", kind="sglang"))
