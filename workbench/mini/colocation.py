"""The colocation lab on a real GPU: three Llama-3.1-8B-shaped mini engines on one device, a static
KV split vs one elastic KV budget they share, under kvcached's staggered ramp
(docs/sources.md#upstream-kvcached-colocation), scaled to fit a few minutes of GPU time.
``backend="host"`` runs the same code on the CPU with the host VMM device (a smoke run; use the
``tiny`` model there).

Setup (one process, ``instances`` engines, each with its own weights):

* ``static``: each engine owns a plain ``torch`` allocation of ``budget / instances`` bytes (what
  vLLM does with ``gpu_memory_utilization``);
* ``elastic``: each engine's pool reserves virtual room for the whole budget and maps page ids on
  demand from the backend's device (``workbench.backends.make_device``); a
  :class:`~workbench.core.device.BudgetDevice`
  caps what all of them map together at ``budget`` (kvcached's shared GPU memory, made explicit so
  the comparison holds the same bytes as the static split).

Compute: one thread advances every engine (:class:`~workbench.mini.instance.MiniInstance`, the
engine protocol) in turn, time-slicing at step granularity as the simulator models it. TTFT =
first token - scheduled arrival (queueing included), the simulator's definition; no HTTP in the
loop, so the figures are the engine's, not a client's.

Scaling (documented in the record): arrival times are divided by ``time_scale`` (rates multiplied
by it) and completions shortened from 256 to ``256 / time_scale`` tokens; prompts stay 256 tokens.
The points, record and Markdown are the colocation lab's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from workbench.core.budget_device import BudgetDevice
from workbench.engines.metrics import summarize
from workbench.engines.sched.request import Request
from workbench.engines.sim.workloads import ramp_trace
from workbench.mini.engine import Engine, EngineConfig
from workbench.mini.instance import MiniInstance
from workbench.mini.kv import KVSpec
from workbench.mini.model import build_model, get_config
from workbench.mini.warmup import SLOW_STEP_S, CompileLog, step_shape, warm_up
from workbench.outfiles import write_repeat
from workbench.units import GiB

MODES = ("static", "elastic")  # the colocation lab's two ways to hold the KV budget


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
    # scaled to a 2 GiB budget that would park most of it. Default (the earlier runs' setup):
    # none mapped ahead, one freed page id parked, maps inline on the engine thread. With
    # ``mapper`` a background thread (kvcached's preallocation thread) keeps the reserve filled;
    # the lab then keeps 1 page id (its gpu runner's config_for).
    mapper: bool = False
    min_reserved_pages: int = 0
    max_reserved_pages: int = 1
    seed: int = 0
    modes: tuple[str, ...] = MODES
    repeats: int = 1
    first_repeat: int = 0  # repeat r runs the modes in order (r even) or reversed (r odd)
    out_dir: str | None = None  # repeat_<r>.json per repeat, rewritten after every point
    device: str = "cuda"  # "cpu" runs the same code on the host VMM device (smoke tests)
    cuda_graphs: bool | None = None  # decode CUDA graphs; None: on where the device is CUDA
    extra: dict = field(default_factory=dict)

    @property
    def output_len(self) -> int:
        return max(2, round(self.completion_len / self.time_scale))

    def mode_order(self, repeat: int) -> tuple[str, ...]:
        return self.modes if repeat % 2 == 0 else tuple(reversed(self.modes))


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
                 gpu_device=None, compiles: CompileLog | None = None):
        self.cfg, self.mode = cfg, mode
        self.compiles = compiles or CompileLog()
        mcfg = get_config(cfg.model)
        budget = int(cfg.budget_gib * GiB)
        ecfg = EngineConfig(max_num_seqs=cfg.max_num_seqs,
                            max_batched_tokens=cfg.max_batched_tokens,
                            cuda_graphs=cfg.cuda_graphs)
        self.budget_dev = None
        self.engines: list[Engine] = []
        if mode == "elastic":
            if gpu_device is None:
                from workbench.backends import for_torch_device, make_device

                # the backend of the engines' torch device (zero_page: ignored on the host)
                gpu_device = make_device(for_torch_device(cfg.device), zero_page=False)
            gran = gpu_device.granularity  # creates are whole pages: the same creates succeed
            self.budget_dev = BudgetDevice(gpu_device, budget // gran * gran)
        for i, model in enumerate(models):
            if mode == "static":
                spec = KVSpec("block", "static", budget // cfg.instances)
                pool_dev = None
            else:
                spec = KVSpec("block", "vmm", budget, min_reserved_pages=cfg.min_reserved_pages,
                              max_reserved_pages=cfg.max_reserved_pages, gpu_utilization=1.0,
                              background_mapper=cfg.mapper)
                pool_dev = self.budget_dev
            self.engines.append(Engine(mcfg, spec, cfg.device, ecfg, model=model,
                                       pool_device=pool_dev, name=f"{mode}{i}"))
        # every kind of step a run meets (mixed, recompute-length, chunked), before timing:
        # [engine, seconds, shape] of each warm-up step, and the Triton compiles they caused
        t0 = time.perf_counter()
        self.warmup = [[i, round(st.seconds, 4), step_shape(st)] for i, eng in
                       enumerate(self.engines) for st in warm_up(eng, cfg.prompt_len)]
        self.warmup_compiles = self.compiles.take(t0)

    def kv_capacity_tokens(self) -> list[int]:
        """Tokens each engine's block table can address (elastic: the whole budget each; what
        it can hold at once depends on what the others have mapped)."""
        return [(e.kv.geometry.num_blocks - 1) * e.kv.block_size for e in self.engines]

    def _timed_allocs(self) -> list[list[float]]:
        """Wrap each ledger's ``alloc`` to time it on the calling (engine) thread: the request
        path's share of mapping, lock waits included. Returns [calls, seconds] per engine."""
        acc = []
        for e in self.engines:
            mgr, box = e.kv.manager, [0, 0.0]
            inner = type(mgr).alloc.__get__(mgr)

            def alloc(n: int, _inner=inner, _box=box):
                t = time.perf_counter()
                try:
                    return _inner(n)
                finally:
                    _box[0] += 1
                    _box[1] += time.perf_counter() - t

            mgr.alloc = alloc
            acc.append(box)
        return acc

    def _untime_allocs(self) -> None:
        for e in self.engines:
            e.kv.manager.__dict__.pop("alloc", None)

    def run(self, traces: list[list[Request]], output_len: int,
            timeline_every_s: float = 0.5) -> dict:
        """Each engine gets its trace (``output_len`` tokens each) on one shared clock."""
        _sync(self.cfg.device)
        if self.budget_dev is not None:
            self.budget_dev.take_counts()
        allocs = self._timed_allocs()
        pre0 = [e.num_preemptions for e in self.engines]
        t0 = time.perf_counter()
        self.compiles.take(t0)
        insts = [MiniInstance(e, t0=t0, sample_every_s=None) for e in self.engines]
        for inst, trace in zip(insts, traces, strict=True):
            inst.submit(Request(r.rid, r.prompt, output_len, r.arrival) for r in trace)
        timeline: list[list] = []
        step_t: list[list[float]] = [[] for _ in self.engines]  # each step's end, s
        next_sample = 0.0
        try:
            while any(i.has_work() for i in insts):
                now = time.perf_counter() - t0
                for k, inst in enumerate(insts):  # admits what has arrived, then one step each
                    n = len(inst.engine.stats.steps)
                    inst.advance(now)
                    if len(inst.engine.stats.steps) > n:
                        step_t[k].append(round(time.perf_counter() - t0, 4))
                if now >= next_sample:
                    timeline.append(self._sample(now))
                    next_sample += timeline_every_s
                nxt = [a for a in (i.next_arrival() for i in insts) if a is not None]
                if nxt and not any(e.scheduler.running for e in self.engines):
                    time.sleep(max(0.0, min(0.002, min(nxt) - (time.perf_counter() - t0))))
        finally:
            self._untime_allocs()
        wall = time.perf_counter() - t0
        return self._result(insts, wall, timeline, step_t, allocs, pre0)

    def _sample(self, now: float) -> list:
        """[t, used blocks per engine, mapped bytes per engine, waiting per engine,
        running per engine]."""
        es = self.engines
        return ([round(now, 3)] + [e.kv.manager.used_blocks for e in es]
                + [e.kv.manager.mapped_bytes for e in es]
                + [len(e.scheduler.waiting) for e in es] + [len(e.scheduler.running) for e in es])

    def _result(self, insts: list[MiniInstance], wall: float, timeline: list, step_t: list,
                allocs: list, pre0: list[int]) -> dict:
        per = [i.metrics().as_dict() for i in insts]
        # one-off costs on the request path: steps over SLOW_STEP_S with their kind
        slow = [[k, t, round(st.seconds, 4), step_shape(st)] for k, e in enumerate(self.engines)
                for st, t in zip(e.stats.steps, step_t[k], strict=False)
                if st.seconds > SLOW_STEP_S]
        longest = max((st.seconds for e in self.engines for st in e.stats.steps), default=0.0)
        overall = summarize([s for i in insts for s in i.seqs]).as_dict()
        steps = [[i] + st.row() + [t] for i, e in enumerate(self.engines)
                 for st, t in zip(e.stats.steps, step_t[i], strict=False)]
        requests = [[k, round(s.arrival - i.t0, 4), round(s.first_token - s.arrival, 4),
                     s.preemptions] for k, i in enumerate(insts) for s in i.seqs
                    if s.first_token is not None]
        for e in self.engines:
            e.stats.steps.clear()
        counts = self.budget_dev.take_counts() if self.budget_dev is not None else None
        mappers = [e.kv.mapper.maps_on_thread if e.kv.mapper else None for e in self.engines]
        return {"mode": self.mode, "wall_s": wall, "overall": overall, "instances": per,
                "timeline": timeline, "steps": steps, "requests": requests,
                "preemptions": [e.num_preemptions - p for e, p in zip(self.engines, pre0,
                                                                      strict=True)],
                "alloc_calls": [[n, round(t, 6)] for n, t in allocs],
                "vmm": counts, "mapper_pages_total": mappers,
                "budget_peak_bytes": counts["peak_bytes"] if counts else None,
                "slow_steps": slow, "max_step_s": round(longest, 4),
                "compiles": self.compiles.take(insts[0].t0 if insts else 0.0)}

    def close(self) -> None:
        for e in self.engines:
            e.close()
        self.engines = []


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(cfg: ColoConfig, log=print) -> list[dict]:
    """Build the models once; then per repeat, per PEAK, every mode (the order alternating by
    repeat). Returns one raw dict per repeat (``runs["PEAK/mode"]``: overall and per-instance
    summaries, timeline, steps, per-request TTFT, VMM calls), each also written to ``out_dir``
    after every point, so a run cut short keeps what it finished."""
    mcfg = get_config(cfg.model)
    t = time.perf_counter()
    models = [build_model(get_config(cfg.model, seed=cfg.seed + i), cfg.device)
              for i in range(cfg.instances)]
    _sync(cfg.device)
    name = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else "cpu"
    head = {"config": asdict(cfg), "device": name, "model_build_s": time.perf_counter() - t,
            "weights_bytes_per_instance": mcfg.params * 2}
    compiles = CompileLog()
    head["compile_hook"] = compiles.installed if compiles.install() else None
    clusters: dict[str, Cluster] = {}
    reps = []
    try:  # the compile hook comes off and the engines close even if a cluster fails to build
        for m in cfg.modes:
            clusters[m] = Cluster(cfg, m, models, compiles=compiles)
        head["warmup"] = {m: {"steps": c.warmup, "compiles": c.warmup_compiles}
                          for m, c in clusters.items()}
        head["kv_capacity_tokens"] = {m: c.kv_capacity_tokens() for m, c in clusters.items()}
        head["cuda_graphs"] = all(e.graphs is not None for c in clusters.values()
                                  for e in c.engines)
        for r in range(cfg.first_repeat, cfg.first_repeat + cfg.repeats):
            order = cfg.mode_order(r)
            rep = {**head, "repeat": r, "order": list(order), "runs": {}}
            reps.append(rep)
            for peak in cfg.peaks:
                traces = scaled_traces(cfg, peak)
                for mode in order:
                    res = clusters[mode].run(traces, cfg.output_len)
                    rep["runs"][f"{peak}/{mode}"] = res
                    write_repeat(cfg.out_dir, rep)
                    o = res["overall"]
                    log(f"repeat {r} PEAK {peak:3d} {mode:7s}: {o['finished']}/{o['requests']} "
                        f"done, TTFT mean {o['ttft']['mean'] * 1e3:.1f} ms p99 "
                        f"{o['ttft']['p99'] * 1e3:.1f} ms, preemptions {o['preemptions']}, "
                        f"wall {res['wall_s']:.1f} s, longest step {res['max_step_s']:.3f} s, "
                        f"{len(res['slow_steps'])} over {SLOW_STEP_S} s, "
                        f"{len(res['compiles'])} compiles"
                        + "".join(f"\n  slow step: engine {s[0]} at {s[1]} s, {s[2]} s, {s[3]}"
                                  for s in res["slow_steps"][:5]))
    finally:
        compiles.uninstall()
        for c in clusters.values():
            c.close()
    return reps
