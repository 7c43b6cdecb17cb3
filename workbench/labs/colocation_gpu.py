"""The colocation lab on a real GPU: three Llama-3.1-8B-shaped mini engines on one device, a static
KV split vs one elastic KV budget they share, under kvcached's staggered ramp (research/kvcached.md
§6.1), scaled to fit a few minutes of GPU time. ``backend="host"`` runs the same code on the CPU
with the host VMM device (a smoke run; use the ``tiny`` model there).

Setup (one process, ``instances`` engines, each with its own weights):

* ``static``: each engine owns a plain ``torch`` allocation of ``budget / instances`` bytes (what
  vLLM does with ``gpu_memory_utilization``);
* ``elastic``: each engine's pool reserves virtual room for the whole budget and maps page ids on
  demand from the backend's device (``workbench.backends.make_device``); a :class:`BudgetDevice`
  caps what all of them map together at ``budget`` (kvcached's shared GPU memory, made explicit so
  the comparison holds the same bytes as the static split).

Compute: one thread advances every engine (:class:`~workbench.mini.instance.MiniInstance`, the
engine protocol) in turn, time-slicing at step granularity as the simulator models it. TTFT =
first token - scheduled arrival (queueing included), the simulator's definition; no HTTP in the
loop, so the figures are the engine's, not a client's.

Scaling (documented in the record): arrival times are divided by ``time_scale`` (rates multiplied
by it) and completions shortened from 256 to ``256 / time_scale`` tokens; prompts stay 256 tokens.
The points, record and Markdown are the lab's (:mod:`workbench.labs.colocation`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from workbench.core.device import MemInfo
from workbench.engines.metrics import summarize
from workbench.engines.sched.request import Request
from workbench.engines.sim.workloads import ramp_trace
from workbench.errors import DeviceError
from workbench.labs.base import Progress
from workbench.labs.colocation import MODES, ColocationParams, ColocationRun
from workbench.labs.record import Manifest
from workbench.mini.engine import Engine, EngineConfig
from workbench.mini.instance import MiniInstance
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
    model: str = "llama-3.1-8b"
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
    modes: tuple[str, ...] = MODES
    device: str = "cuda"  # "cpu" runs the same code on the host VMM device (smoke tests)
    extra: dict = field(default_factory=dict)

    @property
    def output_len(self) -> int:
        return max(2, round(self.completion_len / self.time_scale))


def scaled_traces(cfg: ColoConfig, peak: int) -> list[list[Request]]:
    """Per instance: kvcached's ramp at ``peak``, time-compressed, token ids in the vocabulary."""
    vocab = get_config(cfg.model).vocab_size
    out = []
    for i in range(cfg.instances):
        reqs = ramp_trace(peak, i, num_models=cfg.instances, prompt_len=cfg.prompt_len,
                          output_len=cfg.output_len, seed=cfg.seed)
        out.append([Request(r.rid, [t % vocab for t in r.prompt], r.max_new_tokens,
                            r.arrival / cfg.time_scale, r.group) for r in reqs])
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
            if gpu_device is None:
                from workbench.backends import make_device

                gpu_device = make_device("host") if cfg.device == "cpu" else \
                    make_device("gpu", zero_page=False)
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

    def run(self, traces: list[list[Request]], output_len: int,
            timeline_every_s: float = 0.5) -> dict:
        """Each engine gets its trace (``output_len`` tokens each) on one shared clock."""
        _sync(self.cfg.device)
        t0 = time.perf_counter()
        insts = [MiniInstance(e, t0=t0, sample_every_s=None) for e in self.engines]
        for inst, trace in zip(insts, traces, strict=True):
            inst.submit(Request(r.rid, r.prompt, output_len, r.arrival) for r in trace)
        timeline: list[list] = []
        next_sample = 0.0
        while any(i.has_work() for i in insts):
            now = time.perf_counter() - t0
            for inst in insts:  # admits what has arrived, then at most one step each
                inst.advance(now)
            if now >= next_sample:
                timeline.append([round(now, 3)] + [e.kv.manager.used_blocks
                                                   for e in self.engines]
                                + [e.kv.manager.mapped_bytes for e in self.engines])
                next_sample += timeline_every_s
            nxt = [a for a in (i.next_arrival() for i in insts) if a is not None]
            if nxt and not any(e.scheduler.running for e in self.engines):
                time.sleep(max(0.0, min(0.002, min(nxt) - (time.perf_counter() - t0))))
        wall = time.perf_counter() - t0
        per = [i.metrics().as_dict() for i in insts]
        overall = summarize([s for i in insts for s in i.seqs]).as_dict()
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


def run(cfg: ColoConfig, log=print) -> dict:
    """Build the models once, then for each PEAK run every mode; returns the raw result dict
    (``runs["PEAK/mode"]``: overall and per-instance summaries, timeline, steps)."""
    mcfg = get_config(cfg.model)
    t = time.perf_counter()
    models = [build_model(get_config(cfg.model, seed=cfg.seed + i), cfg.device)
              for i in range(cfg.instances)]
    _sync(cfg.device)
    name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu"
    res: dict = {"config": asdict(cfg), "device": name,
                 "model_build_s": time.perf_counter() - t, "runs": {},
                 "weights_bytes_per_instance": mcfg.num_params * 2}
    clusters = {m: Cluster(cfg, m, models) for m in cfg.modes}
    res["kv_capacity_tokens"] = {m: c.kv_capacity_tokens() for m, c in clusters.items()}
    try:
        for peak in cfg.peaks:
            traces = scaled_traces(cfg, peak)
            for mode in cfg.modes:
                r = clusters[mode].run(traces, cfg.output_len)
                res["runs"][f"{peak}/{mode}"] = r
                o = r["overall"]
                log(f"PEAK {peak:3d} {mode:7s}: {o['finished']}/{o['requests']} done, TTFT mean "
                    f"{o['ttft']['mean'] * 1e3:.1f} ms, preemptions {o['preemptions']}, "
                    f"wall {r['wall_s']:.1f} s")
    finally:
        for c in clusters.values():
            c.close()
    return res


def config_for(params: ColocationParams, backend: str) -> ColoConfig:
    host = backend == "host"
    cfg = ColoConfig(model=params.model or ("tiny" if host else "llama-3.1-8b"),
                     budget_gib=params.budget_gib, time_scale=params.time_scale,
                     prompt_len=params.prompt_len, completion_len=params.completion_len,
                     seed=params.seed, device="cpu" if host else "cuda")
    if params.peaks:
        cfg.peaks = tuple(params.peaks)
    if params.quick:
        cfg.peaks = cfg.peaks[:2]
    return cfg


def run_mini(params: ColocationParams, backend: str,
             progress: Progress | None = None) -> ColocationRun:
    """The lab's ``gpu`` (CUDA) and ``host`` (CPU) backends: mini engines, real time."""
    cfg = config_for(params, backend)
    done = [0]
    total = len(cfg.peaks) * len(cfg.modes)

    def log(msg: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total, msg.split(":")[0])

    res = run(cfg, log=log)
    runs = res["runs"]
    overall = {(p, m): runs[f"{p}/{m}"]["overall"] for p in cfg.peaks for m in cfg.modes
               if f"{p}/{m}" in runs}
    low = cfg.peaks[0]
    footer = []
    if (low, "static") in overall and (low, "elastic") in overall:
        s, e = overall[(low, "static")], overall[(low, "elastic")]
        res["low_load_overhead"] = {
            "peak": low, "mean_ttft_elastic_over_static": e["ttft"]["mean"] / s["ttft"]["mean"],
            "tpot_elastic_over_static": e["tpot"]["mean"] / s["tpot"]["mean"]}
        lo = res["low_load_overhead"]
        footer = [f"Low load (PEAK {low}): elastic/static mean TTFT "
                  f"{lo['mean_ttft_elastic_over_static']:.3f}, TPOT "
                  f"{lo['tpot_elastic_over_static']:.3f}."]
    return ColocationRun(
        backend=backend, peaks=list(cfg.peaks), overall=overall, time_scale=cfg.time_scale,
        title=f"Colocation on {res['device']}: {cfg.instances} x {cfg.model} (mini engine)",
        setup=[f"KV budget {cfg.budget_gib} GiB in all (static: "
               f"{cfg.budget_gib / cfg.instances:.2f} GiB each); ramp time-compressed "
               f"x{cfg.time_scale}, prompts {cfg.prompt_len}, completions {cfg.output_len} "
               "tokens. PEAK (x scale = req/s); TTFT in ms.", ""],
        footer=footer, record=_record_fields(res, cfg, backend),
        results={"config": res["config"], "device": res["device"],
                 "low_load_overhead": res.get("low_load_overhead"),
                 "runs": {k: {kk: vv for kk, vv in v.items() if kk != "steps"}
                          for k, v in runs.items()}})


def _record_fields(res: dict, cfg: ColoConfig, backend: str) -> dict:
    runs = res["runs"]
    cuda = cfg.device.startswith("cuda")
    manifest = Manifest.collect(
        backend=backend,
        hardware={"gpu": res["device"], "count": 1, "vram_bytes":
                  torch.cuda.get_device_properties(0).total_memory if cuda else None,
                  "driver": None},
        engine_config={"engine": "workbench.mini (vLLM-like scheduler, eager torch, Triton paged "
                       "decode)", "model": f"{cfg.model} (random weights)", "dtype": "bf16",
                       "kv_dtype": "bf16", "tp": 1, "pp": 1, "block_size": 16,
                       "prefix_caching": False, "max_num_batched_tokens": cfg.max_batched_tokens,
                       "max_num_seqs": cfg.max_num_seqs, "chunked_prefill": True,
                       "cuda_graphs": False},
        kvcached_config={"page_size": 2 << 20, "contiguous_layout": True, "prealloc": True,
                         "min_reserved_pages": cfg.min_reserved_pages,
                         "max_reserved_pages": cfg.max_reserved_pages,
                         "memory_limit": int(cfg.budget_gib * GiB)})
    return dict(
        experiment_id=f"colocation-{cfg.instances}x-{cfg.model}-{backend}",
        environment={"backend": backend, "seed": cfg.seed, "peaks": list(cfg.peaks),
                     "command": f"workbench labs run colocation --backend {backend}"},
        model_io={"model": cfg.model, "input_tokens": f"{cfg.prompt_len} (fixed)",
                  "output_tokens": f"{cfg.output_len} (fixed; {cfg.completion_len} / "
                                   "time_scale)", "instances": cfg.instances},
        cache_state="prefix caching off",
        load={"trace": "kvcached ramp, arrival times / time_scale",
              "time_scale": cfg.time_scale, "budget_gib": cfg.budget_gib},
        samples={"runs_per_point": 1, "order": "per PEAK: static then elastic"},
        kv={"capacity_tokens": res.get("kv_capacity_tokens"),
            "elastic_peak_mapped_bytes": {str(p): runs[f"{p}/elastic"]["budget_peak_bytes"]
                                          for p in cfg.peaks if f"{p}/elastic" in runs}},
        correctness="tests/gpu/test_mini_gpu.py: VMM vs static and block vs token generations "
                    "token-for-token identical",
        raw_data={"steps": "results.runs[*].steps", "timelines": "results.runs[*].timeline"},
        open_questions=["eager PyTorch (no CUDA graphs): host overhead inflates step times",
                        "one weight copy per instance but random weights: no EOS, fixed lengths"],
        applicability="One GPU, identical 8B-shaped models, staggered peaks, scaled ramp.",
        manifest=manifest)
