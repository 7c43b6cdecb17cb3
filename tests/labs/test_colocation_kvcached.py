"""kvcached's setting and kvcached 0.1.6 as the third mode of the colocation lab's real-vLLM sweep,
without a GPU: the setting's arithmetic (its trace unscaled, the run's length, the KV total and
each mode's blocks), the refusals before anything starts, kvcached's cumulative map-cost log
differenced per point, and the report's third column built from a made-up record."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from workbench.backends import capabilities
from workbench.engines.metrics import MemorySample
from workbench.engines.real import kvcached
from workbench.engines.real.client import Outcome
from workbench.engines.real.kvcached_budget import setting_budget
from workbench.engines.real.vllm import VllmSpec
from workbench.engines.sched.request import ReqState, Request
from workbench.engines.sim.workloads import kvcached_ramp_traces
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.colocation import server
from workbench.labs.colocation.lab import ColocationLab, kvcached_faster
from workbench.labs.colocation.params import MODES, PAIR, ColocationParams
from workbench.labs.kit.kvcached import PEAKS
from workbench.labs.kit.resolve import LabRun
from workbench.outfiles import write_repeat
from workbench.units import GiB, MiB


def _cfg(**kw) -> server.VllmColoConfig:
    return server.config_for(ColocationParams(engine="vllm", **kw), "gpu")


def test_kvcached_setting_is_its_trace_unscaled_at_its_budget():
    cfg = _cfg(setting="kvcached")
    total = setting_budget().total_bytes
    assert cfg.time_scale == 1 and cfg.output_len == 256 and cfg.prompt_len == 256
    assert cfg.budget_bytes == total and round(total / GiB, 2) == 24.71
    assert cfg.modes == MODES and not cfg.together and cfg.peaks == PEAKS
    assert (cfg.max_num_seqs, cfg.max_batched_tokens) == (256, 2048)
    per = total // cfg.block_bytes
    assert cfg.blocks("static") == per // 3
    assert cfg.blocks("elastic") == cfg.blocks("kvcached") == per
    for peak in (1, 12, 13, 20):
        tr = server.traces(cfg, peak)
        ref = kvcached_ramp_traces(peak, 3, prompt_len=256, output_len=256, seed=cfg.seed)
        assert [[r.arrival for r in t] for t in tr] == [[r.arrival for r in t] for t in ref]
        assert {r.max_new_tokens for t in tr for r in t} == {256}
        assert cfg.run_seconds(peak) == max(r.arrival for t in tr for r in t)
    assert cfg.run_seconds(13) == 3 * 29 + 24


def test_the_compressed_setting_stays_as_it_was():
    cfg = _cfg()
    assert cfg.setting == "compressed" and cfg.modes == PAIR and cfg.together
    assert cfg.time_scale == 4.0 and cfg.budget_bytes == 2 * GiB
    assert cfg.run_seconds(8) == pytest.approx((8.75 * 8 - 1) / 4)
    assert _cfg(modes=MODES).together is False  # kvcached's engines start alone


def _run(backend: str, family: str = "server") -> LabRun:
    return LabRun("colocation", backend, capabilities(backend), family)


def _refusal(params: ColocationParams, run: LabRun) -> str:
    with pytest.raises(ConfigError) as err:
        ColocationLab().check_run(params, run)
    text = str(err.value)
    assert "\n" not in text and "Fix:" in text, text
    return text


def test_the_kvcached_mode_without_kvcached_is_one_line_before_anything(monkeypatch, tmp_path):
    monkeypatch.delenv(kvcached.PYTHON_VAR, raising=False)
    lab = get_lab("colocation")
    for params in (lab.params(engine="vllm", modes="static,elastic,kvcached"),
                   lab.params(engine="vllm", setting="kvcached")):
        assert kvcached.PYTHON_VAR in _refusal(params, _run("gpu"))
    py = tmp_path / "python"
    py.write_text("")
    monkeypatch.setenv(kvcached.PYTHON_VAR, str(py))
    ColocationLab().check_run(lab.params(engine="vllm", setting="kvcached"), _run("gpu"))
    assert "CUDA" in _refusal(lab.params(engine="vllm", setting="kvcached"), _run("host"))


def test_settings_and_modes_outside_their_sweep_are_refused(monkeypatch):
    lab = get_lab("colocation")
    assert "real-vLLM sweep" in _refusal(lab.params(setting="kvcached"), _run("sim", "simulated"))
    assert "real-vLLM sweep" in _refusal(lab.params(modes="static,elastic"), _run("host", "mini"))
    assert "beside static and elastic" in _refusal(
        lab.params(engine="vllm", modes="static,kvcached"), _run("gpu"))
    assert "fixes the time scale" in _refusal(
        lab.params(engine="vllm", setting="kvcached", time_scale=2.0), _run("gpu"))
    monkeypatch.setenv(kvcached.PYTHON_VAR, __import__("sys").executable)
    assert "alone" in _refusal(lab.params(engine="vllm", setting="kvcached", together=True),
                               _run("gpu"))
    with pytest.raises(ConfigError, match="setting"):
        lab.params(setting="fast")


def _log(grow: list[tuple[int, int]], shrink: list[tuple[int, int]]) -> str:
    return "".join([f"[kvcached] prealloc cost: {us} us, prealloc {n} pages.\n" for us, n in grow]
                   + [f"[kvcached] Unmapped {n} pages from KV tensors, cost: {us} us\n"
                      for us, n in shrink])


def test_map_costs_per_point_are_the_log_past_the_last_point():
    first = [_log([(4000, 2)], []), _log([], [(52, 4)])]
    then = [first[0] + _log([(900, 3), (1000, 5)], [(30, 1)]), first[1]]
    got = server.costs_since([kvcached.map_costs(x) for x in first],
                             [kvcached.map_costs(x) for x in then])
    assert got == {"grow": [300.0, 200.0], "shrink": [30.0]}
    assert server.costs_since([kvcached.map_costs(x) for x in then],
                              [kvcached.map_costs(x) for x in then]) == {"grow": [],
                                                                        "shrink": []}


@dataclass
class _Engine:
    samples: list = field(default_factory=list)
    free_samples: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)
    spec: VllmSpec = field(default_factory=lambda: VllmSpec(model="m"))

    def outcome(self, rid: int) -> Outcome:
        return self.outcomes.setdefault(rid, Outcome())


def _point(mode: str, peak: int, ttft: float, repeat: int) -> dict:
    engines, reqs = [_Engine() for _ in range(3)], []
    for k, e in enumerate(engines):
        batch = []
        for i in range(4):
            r = Request(i, [5] * 8, 4, arrival=10.0 + i * 0.1 + k)
            r.first_token = r.arrival + ttft * (1 + 0.1 * i + 0.01 * repeat)
            r.finish, r.output_len, r.state = r.first_token + 0.3, 4, ReqState.FINISHED
            r.token_times = [r.first_token + 0.1 * j for j in range(4)]
            batch.append(r)
        reqs.append(batch)
        e.free_samples = [(10.0, 60 * GiB), (11.0, 50 * GiB)]
        e.samples = [MemorySample(10.0 + 0.1 * j, "x", (j + k) * 256 * MiB, 0, 0)
                     for j in range(10)]
    res = server.point_result(engines, reqs, 10.0, 4.0, [3.0, 0.0, 0.0], [None] * 3,
                              mode=mode, peak=peak)
    if mode == "kvcached":
        res["map_costs"] = {"grow": [100.0 * (repeat + 1)], "shrink": [20.0]}
    return res


# per PEAK and mode: mean TTFT (s) of the made-up sweep
TTFT = {12: {"static": 0.1, "elastic": 0.1, "kvcached": 0.11},
        16: {"static": 0.8, "elastic": 0.12, "kvcached": 0.2}}


def _repeat(r: int, modes=MODES, not_run: dict | None = None) -> dict:
    cfg = _cfg(setting="kvcached", peaks=tuple(TTFT), modes=modes)
    order = list(cfg.mode_order(r))
    c = {**cfg.__dict__, "engine": "vllm", "block_bytes": cfg.block_bytes,
         "budget_bytes": cfg.budget_bytes, "blocks": {m: cfg.blocks(m) for m in cfg.modes}}
    c.update(peaks=list(cfg.peaks), modes=list(cfg.modes))
    ballast = {"free_before": 120 * GiB, "total": 140 * GiB, "mapped_at_start": 0,
               "wanted": 88 * GiB, "held": 88 * GiB, "free_after": 32 * GiB,
               "kvcached_may_map": cfg.budget_bytes}
    rep = {"config": c, "device": "NVIDIA H200", "engine": "vllm", "repeat": r, "order": order,
           "vllm_version": "0.26.0",
           "startup": [{"modes": ["kvcached"], "start_s": 60.0 + r, "free_before": 130 * GiB,
                        "free_after": 120 * GiB, "kvcached": {"engines": [], "ballast": ballast},
                        "engines": {"kvcached0": {"cuda_graphs": True, "eager": False}}}],
           "runs": {f"{p}/{m}": _point(m, p, TTFT[p][m], r) for m in order for p in TTFT
                    if m in modes}}
    if not_run:
        rep["not_run"] = not_run
    return rep


def _report(tmp_path, reps: list[dict]):
    for rep in reps:
        write_repeat(str(tmp_path), rep)
    lab = get_lab("colocation")
    return run_lab("colocation", lab.params(from_dir=str(tmp_path)), "host")


def test_the_report_sets_kvcached_beside_static_and_elastic(tmp_path):
    res = _report(tmp_path, [_repeat(r) for r in range(3)])
    pts = res.tables["points"]
    assert [p["peak"] for p in pts] == [12, 16] and all(p["repeats"] == 3 for p in pts)
    high = pts[1]
    assert high["mean_speedup"] == pytest.approx(0.8 / 0.12, rel=0.01)
    assert high["mean_speedup_kvcached"] == pytest.approx(0.8 / 0.2, rel=0.01)
    assert high["mean_elastic_vs_kvcached"] == pytest.approx(0.2 / 0.12, rel=0.01)
    assert set(high["tpot_ms"]) == set(MODES) and high["preemptions"]["kvcached"] == 3
    assert kvcached_faster(high) == [] and high["kvcached"]["mean_speedup"] == 6.2
    md = res.markdown
    assert "| PEAK | ours static | ours elastic | ours speedup | kvcached 0.1.6 | its speedup |" \
        " elastic vs it | kvcached static |" in md
    assert "TPOT static / elastic / kvcached" in md and "no time scaling" in md
    assert "at least as fast as kvcached 0.1.6 at every PEAK (mean and p99, beyond the " \
           "spread): met." in md
    assert "| kvcached | 200 / 300 (6) | 20 / 20 (6) |" in md
    assert "| elastic | not measured by this sweep |" in md
    assert "Low load (PEAK 12): kvcached/static mean TTFT" in md
    assert "held so that its 5 % headroom rule leaves it 24.71 GiB" in md
    assert "| 16 | kvcached |" in md  # where the time went: its mapped and free columns
    costs = res.record.results["map_costs_us"]
    assert costs["kvcached"]["grow"] == {"p50": 200.0, "p99": 300.0, "n": 6}
    assert costs["elastic"] is None
    assert all("map_costs" not in run for rep in res.record.results["repeats"]
               for run in rep["runs"].values())


def _without_kvcached(rep: dict) -> dict:
    return {**rep, "runs": {k: v for k, v in rep["runs"].items() if not k.endswith("/kvcached")}}


def test_a_kvcached_that_did_not_run_says_why_and_keeps_the_pair(tmp_path):
    why = {"kvcached": {"repeat": 0, "reason": "kvcached 0.1.6 left vLLM partly stock: its log "
                        "has no successful patch of gpu_worker", "engines": []}}
    res = _report(tmp_path, [_without_kvcached(_repeat(r, not_run=why)) for r in range(2)])
    md = res.markdown
    assert "## Modes that did not run" in md
    assert "* kvcached (repeat 0): kvcached 0.1.6 left vLLM partly stock" in md
    assert res.record.results["not_run"]["kvcached"]["reason"].endswith("gpu_worker")
    assert "kvcached 0.1.6 |" not in md and "| kvcached | not measured by this sweep |" in md
    pts = res.tables["points"]
    assert [p["peak"] for p in pts] == [12, 16] and "kvcached" not in pts[1]["mean_ttft_ms"]
    assert pts[1]["mean_speedup"] == pytest.approx(0.8 / 0.12, rel=0.01)


class _Kvc:
    """A kvcached engine as far as the sweep's start-up reads it: its log's patch report."""

    def __init__(self, log: str):
        self.log_text = log

    def facts(self) -> dict:
        return {"kvcached": kvcached.VERSION, "patches": kvcached.patch_report(self.log_text)}


def test_a_partly_patched_kvcached_is_not_run_with_the_patches_it_lacks():
    log = "Successfully patched vllm: elastic_block_pool, engine_core, kv_cache_coordinator\n" \
          "Failed to patch vllm: gpu_worker\n"
    with pytest.raises(server.KvcachedNotRun) as err:
        server.kvcached_facts(_cfg(setting="kvcached"), [_Kvc(log)] * 3, kvcached.Ballast())
    rec = err.value.record
    assert rec["reason"].endswith("no successful patch of allocate_slots, gpu_model_runner, "
                                  "gpu_worker")
    assert rec["engines"][0]["patches"]["failed"] == ["gpu_worker"]


class _KvcUp(_Kvc):
    """A fully patched kvcached engine that has mapped ``mapped`` bytes at start-up."""

    def __init__(self, mapped: int):
        super().__init__("Successfully patched vllm: " + ", ".join(kvcached.ESSENTIAL) + "\n")
        self.mapped = mapped

    def segment(self):
        return kvcached.Segment(0, self.mapped, 0)


class _Ballast(kvcached.Ballast):
    def hold(self, nbytes: int) -> int:  # no CUDA: count what would be held
        self.held.append(max(0, nbytes))
        return max(0, nbytes)


def test_kvcached_on_a_card_that_leaves_it_less_than_the_budget_is_not_run_and_says_by_how_much():
    cfg = _cfg(setting="kvcached")  # 24.71 GiB for every mode
    total = 79 * GiB

    def h100(free=27 * GiB):  # three 8B engines up: kvcached may map 27 - 3.95 GiB
        return lambda: (free, total)

    with pytest.raises(server.KvcachedNotRun) as err:
        server.kvcached_facts(cfg, [_KvcUp(0)] * 3, _Ballast(), h100())
    why = err.value.record["reason"]
    assert why.startswith("this card leaves kvcached 23.05 GiB to map under its 5 % headroom")
    assert "less than the 24.71 GiB every mode gets" in why and "an H200" in why
    assert "\n" not in why
    roomy = server.kvcached_facts(cfg, [_KvcUp(0)] * 3, _Ballast(), h100(90 * GiB))
    b = roomy["ballast"]
    assert b["wanted"] > 0 and b["kvcached_may_map"] == cfg.budget_bytes


class _Closable:
    def __init__(self, closed: list, name: str):
        self.closed, self.name = closed, name

    def close(self) -> None:
        self.closed.append(self.name)


def test_the_sweep_records_kvcached_not_run_once_and_runs_the_pair(monkeypatch, tmp_path):
    started, closed = [], []

    def start(cfg, modes, model, py, root, log, ballast=None):
        started.append(modes)
        if "kvcached" in modes:
            raise server.KvcachedNotRun("RuntimeError: kvcached0 exited (code 1)")
        return {m: [_Closable(closed, f"{m}{i}") for i in range(3)] for m in modes}, \
            {"modes": list(modes)}

    def point(cfg, engines, mode, peak, root):
        o = {"finished": 1, "requests": 1, "ttft": {"mean": 0.1, "p99": 0.1}, "preemptions": 0}
        return {"overall": o, "wall_s": 1.0, "lost": 0}

    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setattr(server.rig, "python_for", lambda lab: "py")
    monkeypatch.setattr(server.rig, "workroot", lambda: root)
    monkeypatch.setattr(server.rig, "model_dir", lambda py, root: "tok")
    monkeypatch.setattr(server.shapes, "write", lambda where, tok, model: where)
    monkeypatch.setattr(server, "start", start)
    monkeypatch.setattr(server, "run_point", point)
    monkeypatch.setattr(server, "vllm_version", lambda engines: "0.26.0")
    cfg = server.config_for(ColocationParams(engine="vllm", setting="kvcached", peaks=(12, 16),
                                             repeats=2), "host")
    lines: list[str] = []
    reps = server.sweep(cfg, log=lines.append)
    assert started.count(("kvcached",)) == 1  # tried once per call
    for rep in reps:
        assert set(rep["runs"]) == {"12/static", "16/static", "12/elastic", "16/elastic"}
        assert rep["not_run"]["kvcached"] == {"repeat": 0, "engines": None,
                                              "reason": "RuntimeError: kvcached0 exited (code 1)"}
    assert sorted(closed) == sorted(f"{m}{i}" for m in PAIR for i in range(3) for _ in range(2))
    assert any("kvcached: not run (RuntimeError" in ln for ln in lines)
    assert not root.exists()
