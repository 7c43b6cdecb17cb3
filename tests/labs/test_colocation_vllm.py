"""The colocation lab's real-vLLM path without vLLM: the engines' arguments (dummy 8B shape, KV
sizes, graphs or eager), the split of the KV total, the points a sweep records (built by the
runner's own row code over stand-in engines), repeat files from two calls merged, step logs read
from a mark, and the report and figures built from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from workbench.engines.metrics import MemorySample
from workbench.engines.real import shapes
from workbench.engines.real.client import Outcome
from workbench.engines.real.vllm import VllmSpec
from workbench.engines.sched.request import ReqState, Request
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab
from workbench.labs.colocation import server
from workbench.labs.colocation.params import merged
from workbench.labs.colocation.server import VllmColoConfig, traces
from workbench.labs.kit import server_rig as rig
from workbench.outfiles import write_repeat
from workbench.units import GiB, MiB


def test_the_8b_shape_config_and_its_kv_bytes(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    out = shapes.write(tmp_path / "m", tok, "llama-3.1-8b")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (32, 4096, 8, 128, 128_256)
    assert cfg["eos_token_id"] == 2 and (out / "tokenizer.json").exists()
    assert shapes.kv_bytes_per_token("llama-3.1-8b") == 128 * 1024
    with pytest.raises(ConfigError, match="no Llama decoder shape"):
        shapes.shape_of("qwen3-8b")


def test_engine_args_graphs_on_cuda_eager_on_the_cpu():
    gpu = VllmSpec(model="m", device="cuda", cuda_graphs=True, kv_cache_bytes=1 << 30,
                   num_gpu_blocks=512, load_format="dummy", max_num_batched_tokens=2048,
                   max_num_seqs=128).args(1, "x")
    assert "--enforce-eager" not in gpu
    cc = json.loads(gpu[gpu.index("--compilation-config") + 1])
    assert cc["cudagraph_mode"] == "FULL_DECODE_ONLY" and max(cc["cudagraph_capture_sizes"]) == 128
    for flag, value in (("--kv-cache-memory-bytes", str(1 << 30)), ("--load-format", "dummy"),
                        ("--num-gpu-blocks-override", "512"),
                        ("--max-num-batched-tokens", "2048")):
        assert gpu[gpu.index(flag) + 1] == value
    cpu = VllmSpec(model="m", device="cpu", cuda_graphs=True).args(1, "x")
    assert "--enforce-eager" in cpu and "--kv-cache-memory-bytes" not in cpu


def test_static_gets_a_third_elastic_the_whole_total():
    cfg = VllmColoConfig(budget_gib=2.0)
    assert cfg.block_bytes == 2 * MiB and cfg.budget_bytes == 2 * GiB
    assert cfg.blocks("elastic") == 1024 and cfg.blocks("static") == 341
    assert [cfg.mode_order(r)[0] for r in range(3)] == ["static", "elastic", "static"]
    odd = VllmColoConfig(budget_gib=0.3)
    assert odd.budget_bytes % (2 * MiB) == 0 and odd.budget_bytes <= 0.3 * GiB
    tr = traces(VllmColoConfig(time_scale=8, completion_len=256), 2)
    assert len(tr) == 3 and tr[1][0].arrival == pytest.approx((2 / 4 + 4) / 8)
    assert all(rig.VOCAB_LO <= t < rig.VOCAB_HI for r in tr[0] for t in r.prompt)
    assert {r.max_new_tokens for t in tr for r in t} == {32}


@dataclass
class _Engine:
    """What the row code reads of a running :class:`VllmEngine`."""

    elastic: bool
    samples: list = field(default_factory=list)
    free_samples: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)

    @property
    def spec(self):
        return VllmSpec(model="m", elastic=self.elastic)

    def outcome(self, rid: int) -> Outcome:
        return self.outcomes.setdefault(rid, Outcome())


def _point(mode: str, peak: int, ttft: float, seed: int) -> dict:
    engines = [_Engine(mode == "elastic") for _ in range(3)]
    reqs = []
    for k, e in enumerate(engines):
        batch = []
        for i in range(4):
            r = Request(i, [5] * 8, 4, arrival=10.0 + i * 0.1 + k)
            r.first_token = r.arrival + ttft * (1 + 0.1 * i + 0.01 * seed)
            r.finish, r.output_len, r.state = r.first_token + 0.3, 4, ReqState.FINISHED
            r.token_times = [r.first_token + 0.1 * j for j in range(4)]
            batch.append(r)
        reqs.append(batch)
        e.free_samples = [(10.0, 100 * GiB), (11.0, 99 * GiB)]
        if e.elastic:
            e.samples = [MemorySample(10.0 + 0.1 * j, "x", (j + k) * 128 * MiB, 0, 0)
                         for j in range(10)]
    steps = [{"t0": 5.0, "fields": list(server.STEP_FIELDS), "rows": [[0.0, 0.01, 256, 3, 4]]},
             None, None]
    return server.point_result(engines, reqs, 10.0, 4.0, [2.0, 0.0, 0.0], steps,
                             mode=mode, peak=peak)


def _repeat(r: int, peaks=(2, 8)) -> dict:
    cfg = VllmColoConfig(peaks=peaks, repeats=1, first_repeat=r)
    order = list(cfg.mode_order(r))
    head = {"config": {**cfg.__dict__, "engine": "vllm", "block_bytes": cfg.block_bytes,
                       "budget_bytes": cfg.budget_bytes,
                       "blocks": {m: cfg.blocks(m) for m in cfg.modes}},
            "device": "NVIDIA H200", "engine": "vllm", "repeat": r, "order": order,
            "vllm_version": "0.26.0",
            "startup": [{"modes": ["static", "elastic"], "start_s": 50.0, "free_before": 140 * GiB,
                         "free_after": 30 * GiB, "engines": {
                             "static0": {"cuda_graphs": True, "eager": False}}}]}
    head["config"]["peaks"] = list(peaks)
    head["config"]["modes"] = list(cfg.modes)
    runs = {}
    for p in peaks:
        for m in order:
            slow = 0.05 if m == "elastic" or p == peaks[0] else 0.05 * p
            runs[f"{p}/{m}"] = _point(m, p, slow, r)
    return {**head, "runs": runs}


def test_a_point_keeps_vllm_preemptions_mapped_peak_and_steps():
    res = _point("elastic", 8, 0.05, 0)
    assert res["overall"]["preemptions"] == 2 and res["instances"][0]["preemptions"] == 2
    assert res["overall"]["finished"] == 12 and res["lost"] == 0
    assert res["free_min"] == 99 * GiB and res["mapped_peak_bytes"] == (9 + 10 + 11) * 128 * MiB
    assert res["steps"][0]["rows"] == [[0.0, 0.01, 256, 3, 4]]
    assert len(res["requests"]) == 12 and res["requests"][0][:3] == [0, 0.0, 0.05]
    assert _point("static", 8, 0.05, 0)["mapped_peak_bytes"] is None


def test_step_logs_are_read_from_the_mark(tmp_path):
    (tmp_path / "steps").mkdir()
    log = tmp_path / "steps" / "e0.jsonl"
    old = {"t": 1.0, "dur_s": 0.5, "prefill_tokens": 1, "decode_tokens": 0, "seqs": 1}
    log.write_text(json.dumps(old) + "\n")
    mark = server.step_mark(tmp_path, "e0")
    with log.open("a") as f:
        for i in range(3):
            f.write(json.dumps({"t": 10.0 + i, "dur_s": 0.01, "prefill_tokens": 256,
                                "decode_tokens": i, "seqs": i + 1}) + "\n")
        f.write("{half a line")
    got = server.read_steps(tmp_path, "e0", mark, 0.0)
    assert got["t0"] == 10.0 and [s[0] for s in got["rows"]] == [0.0, 1.0, 2.0]
    assert server.read_steps(tmp_path, "nobody", 0, 0.0) is None


def test_two_calls_merge_into_one_report_with_the_sims_figure(tmp_path):
    a, b = tmp_path / "call1", tmp_path / "call2"
    write_repeat(str(a), _repeat(0))
    cut = _repeat(1)
    cut["runs"] = dict(list(cut["runs"].items())[:1])  # cut short in the first call
    write_repeat(str(a), cut)
    write_repeat(str(b), _repeat(1))
    write_repeat(str(b), _repeat(2))
    reps = merged(f"{a},{b}")
    assert [r["repeat"] for r in reps] == [0, 1, 2] and len(reps[1]["runs"]) == 4
    lab = get_lab("colocation")
    res = run_lab("colocation", lab.params(from_dir=f"{a},{b}"), "host")
    pts = res.tables["points"]
    assert [p["peak"] for p in pts] == [2, 8] and all(p["repeats"] == 3 for p in pts)
    assert pts[0]["mean_speedup"] == pytest.approx(1.0, abs=0.01)
    assert pts[1]["mean_speedup"] == pytest.approx(8.0, rel=0.01)
    md = res.markdown
    assert "(real vLLM)" in md and "vLLM 0.26.0" in md and "Decode in CUDA graphs" in md
    assert "## Per instance" in md and "## Where the time went" in md
    assert "## Memory both modes see" in md and "static 3 x 341 blocks" in md
    assert res.record.environment["engine"] == "vllm"
    assert set(res.figures) <= {"ttft"}
    out = res.write(tmp_path / "rec.json")
    assert Path(out[0]).stat().st_size < 2 << 20


def test_engine_names_are_checked_before_anything_runs():
    lab = get_lab("colocation")
    with pytest.raises(ConfigError, match="engine"):
        lab.params(engine="sglang")
    with pytest.raises(ConfigError, match="not an engine it runs"):
        lab.check_backend("sim", lab.params(engine="mini"))
