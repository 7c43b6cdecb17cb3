"""The ``vllm`` kind's process plumbing over a stand-in server (no vLLM needed): the Engine
protocol, the streaming client's timings, and that nothing it started outlives it -- after
``close``, and when the process driving it is interrupted mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.core import control
from workbench.engines.base import Engine, PoolView
from workbench.engines.real import VllmEngine, VllmSpec
from workbench.engines.real import vllm as kind
from workbench.engines.real.procs import _alive, descendants
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

HERE = Path(__file__).parent
FAKE = [sys.executable, str(HERE / "fake_server.py")]
ENV = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}


def _gone(pids, folder: str, ipc: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []
    assert not Path(folder).exists()
    assert control.read_segment(ipc) is None


def test_a_run_through_the_protocol_and_nothing_left_after_close():
    eng = VllmEngine("fk", VllmSpec(model="fake", server_cmd=FAKE, startup_timeout_s=60))
    with eng:
        assert isinstance(eng, Engine) and isinstance(eng.kv_pool, PoolView)
        eng.submit([Request(rid=i, prompt=[10 * i, 7], max_new_tokens=5, arrival=0.05 * i)
                    for i in range(4)])
        eng.advance()
        assert not eng.has_work()
        m = eng.metrics()
        assert (m.requests, m.finished) == (4, 4)
        assert m.ttft.p50 > 0 and m.tpot.p50 > 0 and m.e2e.p50 >= m.ttft.p50
        assert [eng.outcome(i).token_ids for i in range(4)] == [[7, 8, 9, 10, 11]] * 4
        deadline = time.monotonic() + 10
        while not eng.memory_timeline() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.memory_timeline()[-1].mapped_bytes > 0 and eng.kv_pool.capacity_bytes > 0
        assert eng.free_samples and eng.free_samples[-1][1] > 0
        pids = [eng.process.pid, *descendants(eng.process.pid)]
        assert len(pids) >= 2  # the server and its "engine core"
        folder, ipc = str(eng.dir), eng.ipc_name
    _gone(pids, folder, ipc)


def test_a_server_that_dies_at_start_is_reported_and_cleaned():
    spec = VllmSpec(model="fake", server_cmd=[sys.executable, "-c", "import sys; sys.exit(3)"],
                    startup_timeout_s=30)
    eng = VllmEngine("bad", spec)
    with pytest.raises(RuntimeError, match="exited with 3"):
        eng.start()
    assert not eng.dir.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_leaves_no_process_segment_or_folder(sig):
    drv = subprocess.Popen([sys.executable, str(HERE / "driver.py")], stdout=subprocess.PIPE,
                           text=True, env=ENV)
    try:
        line = drv.stdout.readline()
        assert line.startswith("STARTED "), line
        got = json.loads(line[8:])
        assert len(got["all"]) >= 2 and Path(got["dir"]).exists()
        assert control.read_segment(got["ipc"]) is not None
        drv.send_signal(sig)
        drv.wait(60)
    finally:
        if drv.poll() is None:
            drv.kill()
    _gone(got["all"], got["dir"], got["ipc"])


def test_engine_vllm_without_vllm_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    assert "make engine-vllm" in kind.vllm_missing()
    with pytest.raises(ConfigError) as err:
        kind.require_vllm("lab 'output-equality' with engine=vllm")
    assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)


def test_the_chapters_real_walk_says_in_one_line_what_it_would_run(monkeypatch, capsys):
    from workbench.labs.kit.real_walk import real_request_walk

    text = real_request_walk("sim")
    assert "\n" not in text and "real vLLM" in text and "'sim'" in text
    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    text = real_request_walk("host")
    assert "\n" not in text and "make engine-vllm" in text
    assert capsys.readouterr().out.count("\n") == 2


def test_engines_started_side_by_side_outlive_the_threads_that_waited_for_them():
    from workbench.labs.kit import server_rig as rig

    engines = [VllmEngine(f"side{i}", VllmSpec(model="fake", server_cmd=FAKE, elastic=False,
                                               startup_timeout_s=60)) for i in range(2)]
    try:
        rig.start_all(engines)
        time.sleep(1.0)  # a parent-death signal tied to a finished thread would have fired
        for e in engines:
            assert e.process.poll() is None
            assert rig.send(e, [[3, 4]], 3, e.sampling) == [[4, 5, 6]]
            assert e.kv_pool.info() is None  # stock: no segment
    finally:
        for e in engines:
            e.close()


def test_labs_run_engine_vllm_without_vllm_stops_in_one_line():
    env = {**ENV, "WORKBENCH_VLLM_PYTHON": "/nonexistent/python"}
    r = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", "output-equality",
                        "--backend", "host", "--param", "engine=vllm"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and "make engine-vllm" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "workbench", "labs", "run", "dynamic-limit",
                        "--backend", "sim", "--param", "engine=sglang"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and "engine=sglang" in r.stderr and "CUDA server only" in r.stderr, \
        r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_run_lab_routes_engine_vllm_itself(monkeypatch):
    """From Python, not only the CLI: the lab's own check refuses (no vLLM) before anything
    runs; on sim, engine=vllm names the simulated vLLM-like engine and passes."""
    from workbench.labs import get_lab, run_lab

    monkeypatch.setattr(kind, "_has_vllm", lambda python: False)
    monkeypatch.setenv("WORKBENCH_VLLM_PYTHON", "/nonexistent/python")
    for name in ("output-equality", "dynamic-limit", "kv-capacity"):
        lab = get_lab(name)
        with pytest.raises(ConfigError) as err:
            run_lab(name, lab.params(engine="vllm", quick=True), "host")
        assert "make engine-vllm" in str(err.value) and "\n" not in str(err.value)
    get_lab("dynamic-limit").check_backend("sim", get_lab("dynamic-limit").params())
    get_lab("output-equality").check_backend("host", get_lab("output-equality").params())
    with pytest.raises(ConfigError, match="engine=sglang on backend 'host': the sglang kind "
                                          "runs SGLang's CUDA server only"):
        get_lab("output-equality").check_backend(
            "host", get_lab("output-equality").params(engine="sglang"))


def test_the_real_lab_turns_a_runners_rows_into_a_record_and_markdown(monkeypatch):
    from workbench.labs import get_lab
    from workbench.labs.output_equality import server as output_equality

    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    real = get_lab("output-equality")
    assert real.check_backend("host", real.params()).family == "mini"
    assert get_lab("kv-capacity").check_backend("sim", get_lab("kv-capacity").params()).family \
        == "simulated"
    monkeypatch.setattr(kind.VllmEngine, "interpreter",
                        classmethod(lambda cls, what: "python-with-vllm"))
    for backend in ("host", "cuda:0"):
        run = real.check_backend(backend, real.params(engine="vllm"))
        assert run.family == "server" and run.kind == "vllm"
    real = get_lab("output-equality")
    row = {"pool": "default", "case": "greedy", "prompts": 2, "equal": 1, "first_diff": 1,
           "diverges_at": [5], "lost": 0, "stock_vs_stock": 1}
    raw = {"backend": "host", "device": "cpu", "small_blocks": 64, "limit": "4MiB",
           "rows": [row], "engines": {"small": {}}}
    monkeypatch.setattr(output_equality, "run",
                        lambda backend, quick=False, kind="vllm", runner=None: raw)
    res = real.run(real.parse_params({"engine": "vllm", "quick": "true"}), "host")
    assert res.record.verdict.startswith("inconclusive") and "| the seed expects |" in res.markdown
    assert res.record.results["equality"] == [row]
    assert res.record.raw_data["wall_s"] >= 0 and res.record.environment["engine"] == "vllm"
