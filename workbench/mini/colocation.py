"""The colocation lab on a real GPU: three Llama-3.1-8B-shaped mini engines on one device, a static
KV split vs one elastic KV budget they share, under kvcached's staggered ramp (research/kvcached.md
§6.1), scaled to fit a few minutes of GPU time.

Setup (one process, one CUDA context, ``instances`` engines, each with its own 16 GB of weights):

* ``static``: each engine owns a plain ``torch`` allocation of ``budget / instances`` bytes (what
  vLLM does with ``gpu_memory_utilization``);
* ``elastic``: each engine's pool reserves virtual room for the whole budget and maps 128 MiB page
  ids (2 MiB x 32 layers x K/V) on demand through ``workbench.gpu``; a :class:`BudgetDevice` caps
  what all of them map together at ``budget`` (kvcached's shared GPU memory, made explicit so
  the comparison holds the same bytes as the static split).

Compute: one driver thread steps every engine with work in turn (time-slicing at step
granularity, as the simulator models it). Requests are injected in-process at their arrival time;
TTFT = first token - scheduled arrival (queueing included), the simulator's definition; no HTTP in
the loop (the server is measured separately), so the figures are the engine's, not a client's.

Scaling (documented in the record): arrival times are divided by ``time_scale`` (rates multiplied
by it) and completions shortened from 256 to ``256 / time_scale`` tokens, so a request lives about
as many seconds-per-rate as in the original and a PEAK point takes ``8.75 * PEAK / time_scale``
seconds instead of ``8.75 * PEAK``; prompts stay 256 tokens.

``python -m workbench.mini.colocation --out DIR`` runs it (GPU); :func:`run` returns the points.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from workbench.core.device import MemInfo
from workbench.engines.metrics import summarize
from workbench.engines.workloads import ramp_trace
from workbench.errors import DeviceError
from workbench.mini.engine import Engine, EngineConfig
from workbench.mini.kv import KVSpec
from workbench.mini.model import build_model, get_config

GiB = 1 << 30


class BudgetDevice:
    """A device shared by several pools whose physical bytes together may not pass ``budget``.

    Everything but ``create``/``release``/``mem_info`` goes to the real device; ``mem_info``
    reports the budget left, so each pool's headroom check sees what the others hold.
    """

    def __init__(self, inner, budget: int):
        self.inner = inner
        self.budget = budget
        self.used = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def create(self, size: int) -> int:
        if self.used + size > self.budget:
            raise DeviceError("create", "out of memory", "CUDA_ERROR_OUT_OF_MEMORY")
        h = self.inner.create(size)
        self._sizes[h] = size
        self.used += size
        self.peak = max(self.peak, self.used)
        return h

    def release(self, handle: int) -> None:
        self.inner.release(handle)
        self.used -= self._sizes.pop(handle)

    def mem_info(self) -> MemInfo:
        return MemInfo(self.budget - self.used, self.budget)

    def __getattr__(self, item: str):
        return getattr(self.inner, item)


@dataclass
class ColoConfig:
    model: str = "llama3-8b"
    instances: int = 3
    budget_gib: float = 2.0  # KV bytes all instances hold together (static: split evenly)
    peaks: tuple[int, ...] = (2, 6, 12)
    time_scale: float = 4.0
    prompt_len: int = 256
    completion_len: int = 256  # before scaling
    max_num_seqs: int = 256
    max_batched_tokens: int = 2048
    # Elastic pools' reserve: kvcached keeps 5..10 page ids (640 MiB..1.25 GiB for an 8B model);
    # scaled to a 2 GiB budget that would park most of it, so none is kept mapped ahead and one
    # freed page id is parked (the ledger refills inline: a reserve would not hide map latency).
    min_reserved_pages: int = 0
    max_reserved_pages: int = 1
    seed: int = 0
    modes: tuple[str, ...] = ("static", "elastic")
    device: str = "cuda"  # "cpu" runs the same code on the host VMM device (smoke tests)
    extra: dict = field(default_factory=dict)

    @property
    def output_len(self) -> int:
        return max(2, round(self.completion_len / self.time_scale))


def scaled_traces(cfg: ColoConfig, peak: int) -> list[list[tuple[float, list[int]]]]:
    """Per instance: (arrival s, prompt) of kvcached's ramp at ``peak``, time-compressed."""
    vocab = get_config(cfg.model).vocab_size
    out = []
    for i in range(cfg.instances):
        reqs = ramp_trace(peak, i, num_models=cfg.instances, prompt_len=cfg.prompt_len,
                          output_len=cfg.output_len, seed=cfg.seed)
        out.append([(r.arrival / cfg.time_scale, [t % vocab for t in r.prompt]) for r in reqs])
    return out


class Cluster:
    """``instances`` engines of one mode on one GPU."""

    def __init__(self, cfg: ColoConfig, mode: str, models: Sequence[torch.nn.Module],
                 gpu_device=None):
        self.cfg, self.mode = cfg, mode
        mcfg = get_config(cfg.model)
        budget = int(cfg.budget_gib * GiB)
        ecfg = EngineConfig(max_num_seqs=cfg.max_num_seqs,
                            max_batched_tokens=cfg.max_batched_tokens)
        self.budget_dev = None
        self.engines: list[Engine] = []
        if mode == "elastic":
            if gpu_device is None and cfg.device == "cpu":
                from workbench.host.device import HostDevice

                gpu_device = HostDevice()
            elif gpu_device is None:
                from workbench.backends import make_device

                gpu_device = make_device("gpu", zero_page=False)
            self.budget_dev = BudgetDevice(gpu_device, budget)
        for i, model in enumerate(models):
            if mode == "static":
                spec = KVSpec("block", "static", budget // cfg.instances)
                pool_dev = None
            else:
                spec = KVSpec("block", "vmm", budget, min_reserved_pages=cfg.min_reserved_pages,
                              max_reserved_pages=cfg.max_reserved_pages, gpu_utilization=1.0)
                pool_dev = self.budget_dev
            self.engines.append(Engine(mcfg, spec, cfg.device, ecfg, model=model,
                                       pool_device=pool_dev, name=f"{mode}{i}"))
        for eng in self.engines:  # compile the kernels, warm the allocator
            eng.generate([[1] * cfg.prompt_len], 4)
            eng.stats.steps.clear()

    def kv_capacity_tokens(self) -> list[int]:
        return [(e.kv.geometry.num_blocks - 1) * e.kv.block_size for e in self.engines]

    def run(self, traces: list[list[tuple[float, list[int]]]], output_len: int,
            timeline_every_s: float = 0.5) -> dict:
        events = sorted((t, i, p) for i, tr in enumerate(traces) for t, p in tr)
        seqs: list[list] = [[] for _ in self.engines]
        timeline: list[list] = []
        _sync(self.cfg.device)
        t0 = time.perf_counter()
        k = 0
        next_sample = 0.0
        while k < len(events) or any(e.has_work() for e in self.engines):
            now = time.perf_counter() - t0
            while k < len(events) and events[k][0] <= now:
                t, i, prompt = events[k]
                seqs[i].append(self.engines[i].add_request(prompt, output_len, arrival=t0 + t))
                k += 1
            busy = False
            for eng in self.engines:
                if eng.has_work():
                    eng.step()
                    busy = busy or bool(eng.scheduler.running)
            if now >= next_sample:
                timeline.append([round(now, 3)] + [e.kv.manager.used_blocks
                                                   for e in self.engines]
                                + [e.kv.manager.mapped_bytes for e in self.engines])
                next_sample += timeline_every_s
            if not busy and k < len(events):
                time.sleep(max(0.0, min(0.002, events[k][0] - (time.perf_counter() - t0))))
        wall = time.perf_counter() - t0
        per = [summarize(s).as_dict() for s in seqs]
        overall = summarize([r for s in seqs for r in s]).as_dict()
        steps = [[i] + st.row() for i, e in enumerate(self.engines) for st in e.stats.steps]
        for e in self.engines:
            e.stats.steps.clear()
        return {"mode": self.mode, "wall_s": wall, "overall": overall, "instances": per,
                "timeline": timeline, "steps": steps,
                "budget_peak_bytes": self.budget_dev.peak if self.budget_dev else None}

    def close(self) -> None:
        for e in self.engines:
            e.close()
        self.engines = []


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _ms(x: float) -> float:
    return round(x * 1e3, 1)


def run(cfg: ColoConfig, out_dir: Path | None = None, log=print) -> dict:
    """Build the models once, then for each PEAK run every mode; returns the result dict."""
    mcfg = get_config(cfg.model)
    t = time.perf_counter()
    models = [build_model(get_config(cfg.model, seed=cfg.seed + i), cfg.device)
              for i in range(cfg.instances)]
    _sync(cfg.device)
    name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu"
    res: dict = {"config": asdict(cfg), "device": name,
                 "model_build_s": time.perf_counter() - t, "runs": {}, "points": [],
                 "weights_bytes_per_instance": mcfg.num_params * 2}
    clusters = {m: Cluster(cfg, m, models) for m in cfg.modes}
    res["kv_capacity_tokens"] = {m: c.kv_capacity_tokens() for m, c in clusters.items()}

    def save() -> None:
        if out_dir is not None:
            (out_dir / "colocation.json").write_text(json.dumps(res))

    try:
        for peak in cfg.peaks:
            traces = scaled_traces(cfg, peak)
            for mode in cfg.modes:
                r = clusters[mode].run(traces, cfg.output_len)
                res["runs"][f"{peak}/{mode}"] = r
                o = r["overall"]
                log(f"PEAK {peak:3d} {mode:7s}: {o['finished']}/{o['requests']} done, TTFT mean "
                    f"{_ms(o['ttft']['mean'])} ms p99 {_ms(o['ttft']['p99'])} ms, TPOT "
                    f"{_ms(o['tpot']['mean'])} ms, preemptions {o['preemptions']}, "
                    f"wall {r['wall_s']:.1f} s")
                save()
            if set(cfg.modes) >= {"static", "elastic"}:
                s = res["runs"][f"{peak}/static"]["overall"]
                e = res["runs"][f"{peak}/elastic"]["overall"]
                res["points"].append({
                    "peak": peak, "effective_peak_rps": peak * cfg.time_scale,
                    "mean_ttft_ms": {"static": _ms(s["ttft"]["mean"]),
                                     "elastic": _ms(e["ttft"]["mean"])},
                    "p50_ttft_ms": {"static": _ms(s["ttft"]["p50"]),
                                    "elastic": _ms(e["ttft"]["p50"])},
                    "p99_ttft_ms": {"static": _ms(s["ttft"]["p99"]),
                                    "elastic": _ms(e["ttft"]["p99"])},
                    "mean_speedup": round(s["ttft"]["mean"] / e["ttft"]["mean"], 3),
                    "p99_speedup": round(s["ttft"]["p99"] / e["ttft"]["p99"], 3),
                    "tpot_ms": {"static": _ms(s["tpot"]["mean"]),
                                "elastic": _ms(e["tpot"]["mean"])},
                    "preemptions": {"static": s["preemptions"], "elastic": e["preemptions"]},
                })
                save()
    finally:
        for c in clusters.values():
            c.close()
    if res["points"]:
        low = res["points"][0]
        res["low_load_overhead"] = {
            "peak": low["peak"],
            "mean_ttft_elastic_over_static": low["mean_ttft_ms"]["elastic"]
            / low["mean_ttft_ms"]["static"],
            "tpot_elastic_over_static": low["tpot_ms"]["elastic"] / low["tpot_ms"]["static"]}
    save()
    return res


def markdown(res: dict) -> str:
    c = res["config"]
    lines = [f"# Colocation on {res['device']}: {c['instances']} x {c['model']} (mini engine)", "",
             f"KV budget {c['budget_gib']} GiB in all (static: "
             f"{c['budget_gib'] / c['instances']:.2f} GiB each); ramp time-compressed "
             f"x{c['time_scale']}, prompts {c['prompt_len']}, "
             f"completions {max(2, round(c['completion_len'] / c['time_scale']))} tokens.", "",
             "| PEAK (x scale = rps) | mean TTFT static / elastic (ms) | speedup | p99 TTFT "
             "static / elastic (ms) | speedup | TPOT static / elastic (ms) | preemptions s / e |",
             "|---|---|---|---|---|---|---|"]
    for p in res["points"]:
        lines.append(
            f"| {p['peak']} ({p['effective_peak_rps']:g}) | {p['mean_ttft_ms']['static']} / "
            f"{p['mean_ttft_ms']['elastic']} | {p['mean_speedup']}x | {p['p99_ttft_ms']['static']}"
            f" / {p['p99_ttft_ms']['elastic']} | {p['p99_speedup']}x | {p['tpot_ms']['static']} /"
            f" {p['tpot_ms']['elastic']} | {p['preemptions']['static']} / "
            f"{p['preemptions']['elastic']} |")
    if "low_load_overhead" in res:
        lo = res["low_load_overhead"]
        lines += ["", f"Low load (PEAK {lo['peak']}): elastic/static mean TTFT "
                      f"{lo['mean_ttft_elastic_over_static']:.3f}, TPOT "
                      f"{lo['tpot_elastic_over_static']:.3f}."]
    return "\n".join(lines) + "\n"


def run_lab(peaks: Sequence[int] | None = None, *, seed: int = 0, quick: bool = False,
            progress=None, out_dir: Path | None = None, **overrides):
    """``workbench labs run colocation --backend gpu``: returns ``(LabRecord, markdown)``.

    ``peaks`` are kvcached's PEAK values before time compression (default 2, 6, 12); ``quick``
    runs only the first two.
    """
    cfg = ColoConfig(seed=seed, **overrides)
    if peaks:
        cfg.peaks = tuple(peaks)
    if quick:
        cfg.peaks = cfg.peaks[:2]
    done = [0]
    total = len(cfg.peaks) * len(cfg.modes)

    def log(msg: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total, msg.split(":")[0])

    res = run(cfg, out_dir, log=log)
    md = markdown(res)
    return lab_record(res), md


def lab_record(res: dict):
    """The unified result record (``workbench.labs.record``) of a GPU colocation run."""
    from workbench.labs.record import LabRecord, Manifest

    c = res["config"]
    pts = res["points"]
    runs = res["runs"]

    def dist(mode: str, key: str) -> dict:
        return {str(p): runs[f"{p}/{mode}"]["overall"][key] for p in c["peaks"]
                if f"{p}/{mode}" in runs}

    manifest = Manifest.collect(
        backend="gpu",
        hardware={"gpu": res["device"], "count": 1, "vram_bytes":
                  torch.cuda.get_device_properties(0).total_memory
                  if torch.cuda.is_available() else None, "driver": None},
        engine_config={"engine": "workbench.mini (vLLM-like scheduler, eager torch, Triton paged "
                       "decode)", "model": f"{c['model']} (random weights)", "dtype": "bf16",
                       "kv_dtype": "bf16", "tp": 1, "pp": 1, "block_size": 16,
                       "prefix_caching": False, "max_num_batched_tokens": c["max_batched_tokens"],
                       "max_num_seqs": c["max_num_seqs"], "chunked_prefill": True,
                       "cuda_graphs": False},
        kvcached_config={"page_size": 2 << 20, "contiguous_layout": True, "prealloc": True,
                         "min_reserved_pages": c["min_reserved_pages"],
                         "max_reserved_pages": c["max_reserved_pages"],
                         "memory_limit": int(c["budget_gib"] * GiB)})
    best = max(pts, key=lambda r: r["mean_speedup"]) if pts else None
    lo = res.get("low_load_overhead")
    verdict = "no complete PEAK point" if not pts else (
        f"On {res['device']}: mean TTFT speedup up to {best['mean_speedup']}x (PEAK "
        f"{best['peak']}), p99 up to {max(p['p99_speedup'] for p in pts)}x; low-load "
        f"elastic/static mean TTFT {lo['mean_ttft_elastic_over_static']:.3f}.")
    return LabRecord(
        experiment_id=f"colocation-{c['instances']}x-{c['model']}-gpu",
        hypothesis="Sharing one KV budget elastically between co-located instances lowers TTFT "
                   "when one instance peaks while the others idle, at a small low-load cost.",
        environment={"backend": "gpu", "seed": c["seed"], "peaks": list(c["peaks"]),
                     "command": "python -m workbench.mini.colocation"},
        model_io={"model": c["model"], "input_tokens": f"{c['prompt_len']} (fixed)",
                  "output_tokens": f"{max(2, round(c['completion_len'] / c['time_scale']))} "
                                   "(fixed; 256 / time_scale)", "instances": c["instances"]},
        cache_state="prefix caching off",
        load={"trace": "kvcached ramp, arrival times / time_scale", "time_scale":
              c["time_scale"], "budget_gib": c["budget_gib"]},
        samples={"runs_per_point": 1, "order": "per PEAK: static then elastic"},
        outcomes={m: {k: {str(p): runs[f"{p}/{m}"]["overall"][k] for p in c["peaks"]
                          if f"{p}/{m}" in runs} for k in ("finished", "requests")}
                  for m in c["modes"]},
        ttft={m: dist(m, "ttft") for m in c["modes"]},
        tpot_itl={f"tpot_{m}": dist(m, "tpot") for m in c["modes"]},
        e2e={m: dist(m, "e2e") for m in c["modes"]},
        throughput={m: dist(m, "output_tok_per_s") for m in c["modes"]},
        slo_goodput={m: dist(m, "goodput_req_per_s") for m in c["modes"]},
        hits={"local": 0, "external": None, "denominator": "prefix caching off"},
        transfer_bytes=None, phase_times=None,
        kv={"capacity_tokens": res.get("kv_capacity_tokens"),
            "preemptions": {m: dist(m, "preemptions") for m in c["modes"]},
            "elastic_peak_mapped_bytes": {str(p): runs[f"{p}/elastic"]["budget_peak_bytes"]
                                          for p in c["peaks"] if f"{p}/elastic" in runs}},
        correctness="tests/gpu/test_mini_gpu.py: VMM vs static and block vs token generations "
                    "token-for-token identical",
        raw_data={"steps": "results.runs[*].steps", "timelines": "results.runs[*].timeline"},
        verdict=verdict,
        mechanism="A static split caps each instance's in-flight KV; at its peak it preempts and "
                  "queues. Elastic pools map the pages the idle instances leave unused.",
        open_questions=["eager PyTorch (no CUDA graphs): host overhead inflates step times",
                        "one weight copy per instance but random weights: no EOS, fixed lengths"],
        applicability="One GPU, three identical 8B-shaped models, staggered peaks, scaled ramp.",
        manifest=manifest, results={"points": pts, "low_load_overhead": lo,
                                    "runs": {k: {kk: vv for kk, vv in v.items() if kk != "steps"}
                                             for k, v in runs.items()}})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="colocation lab on a CUDA GPU (mini engines)")
    ap.add_argument("--out", type=Path, default=Path("artifacts/mini"))
    ap.add_argument("--peaks", default="2,6,12")
    ap.add_argument("--budget-gib", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--modes", default="static,elastic")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--min-reserved", type=int, default=0)
    ap.add_argument("--max-reserved", type=int, default=1)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = ColoConfig(model=args.model, budget_gib=args.budget_gib, time_scale=args.time_scale,
                     peaks=tuple(int(p) for p in args.peaks.split(",")),
                     modes=tuple(args.modes.split(",")), device=args.device,
                     min_reserved_pages=args.min_reserved, max_reserved_pages=args.max_reserved)
    res = run(cfg, args.out, log=lambda m: print(m, flush=True))
    md = markdown(res)
    (args.out / "colocation.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
