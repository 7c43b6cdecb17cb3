"""The colocation lab on real vLLM: ``instances`` vLLM servers of one model shape (random weights,
``--load-format dummy``), each in its own process on one device, under kvcached's staggered ramp.

* ``static``: stock vLLM, each a fixed ``1/instances`` of the KV total
  (``num_gpu_blocks_override``);
* ``elastic``: autopatched vLLM, each able to address the whole total, every map charged to one
  ``WORKBENCH_KV_GPU_BUDGET`` of that total shared by the processes (a map past it is a miss).

Both modes skip vLLM's memory profiling (``kv_cache_memory_bytes``), so engines started side by
side cannot misread each other's weights as their own. ``together``: both modes' engines are
started once and kept for the whole sweep (one start-up instead of one per repeat and mode);
else per repeat, per mode, its engines start, serve every PEAK, and close. Arrival times are
divided by ``time_scale`` and completions shortened to ``completion_len / time_scale``; TTFT is
the streaming client's (first token - scheduled arrival, queueing and HTTP included). Each
repeat's raw JSON is rewritten to ``out_dir`` after every point (:mod:`.vllm_rows`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import workbench.labs.colocation.vllm_rows as rows
from workbench.engines.real import shapes
from workbench.engines.sched.request import Request
from workbench.engines.sim.workloads import ramp_trace
from workbench.labs.kit import server_rig as rig
from workbench.outfiles import write_repeat
from workbench.units import GiB, MiB

MODES = ("static", "elastic")


@dataclass
class VllmColoConfig:
    model: str = "llama-3.1-8b"  # a registry shape (``host``: the CPU's small stand-in)
    instances: int = 3
    budget_gib: float = 2.0  # KV bytes all instances hold together (static: split evenly)
    peaks: tuple[int, ...] = (2, 4, 7, 10, 14)
    time_scale: float = 8.0
    prompt_len: int = 256
    completion_len: int = 256  # before scaling
    max_num_seqs: int = 128
    max_batched_tokens: int = 2048
    min_reserved_pages: int = 0  # elastic: page ids mapped ahead / parked after a free
    max_reserved_pages: int = 1
    seed: int = 0
    modes: tuple[str, ...] = MODES
    repeats: int = 1
    first_repeat: int = 0  # repeat r runs the modes in order (r even) or reversed (r odd)
    out_dir: str | None = None
    device: str = "cuda"
    cuda_graphs: bool = True
    together: bool = True
    deadline_s: float | None = None  # no new point once this much wall time has gone by
    drain_s: float = 120.0  # a point's requests get this long past the last arrival
    step_logs: bool = True  # each engine its step log, where this checkout has the knob
    warmup_peak: int = 1  # after start-up, one unrecorded point at this PEAK per mode (0: none)

    @property
    def output_len(self) -> int:
        return max(2, round(self.completion_len / self.time_scale))

    @property
    def block_size(self) -> int:
        return 32 if self.device == "cpu" else 16

    @property
    def block_bytes(self) -> int:
        return self.block_size * shapes.kv_bytes_per_token(self.model)

    @property
    def budget_bytes(self) -> int:  # whole 2 MiB granules, the shared budget's unit
        return int(self.budget_gib * GiB) // (2 * MiB) * (2 * MiB)

    def blocks(self, mode: str) -> int:
        total = self.budget_bytes // self.block_bytes
        return total if mode == "elastic" else total // self.instances

    def mode_order(self, repeat: int) -> tuple[str, ...]:
        return self.modes if repeat % 2 == 0 else tuple(reversed(self.modes))

    def run_seconds(self, peak: int) -> float:
        """The last arrival of a point (scaled), a guide to how long it runs."""
        return (8.75 * peak - 1) / self.time_scale


def traces(cfg: VllmColoConfig, peak: int) -> list[list[Request]]:
    """Per instance: kvcached's ramp at ``peak``, time-compressed, token ids the tokenizer has."""
    span = rig.VOCAB_HI - rig.VOCAB_LO
    out = []
    for i in range(cfg.instances):
        reqs = ramp_trace(peak, i, num_models=cfg.instances, prompt_len=cfg.prompt_len,
                          output_len=cfg.output_len, seed=cfg.seed)
        out.append([Request(r.rid, [rig.VOCAB_LO + t % span for t in r.prompt], cfg.output_len,
                            r.arrival / cfg.time_scale, r.group) for r in reqs])
    return out


def _step_log_knob() -> str | None:
    """The step-log knob's variable where this checkout knows it (engines append one JSON line
    per scheduler step there), else None: no step logs."""
    from workbench.knobs import KNOBS
    from workbench.settings import var

    return var("step_log") if "step_log" in KNOBS else None


def make_engines(cfg: VllmColoConfig, mode: str, model: str, py: str, root: Path) -> list:
    knob = _step_log_knob() if cfg.step_logs else None
    engines = []
    for i in range(cfg.instances):
        name = f"{mode}{i}"
        env = {knob: str(root / "steps" / f"{name}.jsonl")} if knob else {}
        knobs = {}
        if mode == "elastic":
            knobs = {"gpu_budget": str(cfg.budget_bytes),
                     "min_reserved_pages": str(cfg.min_reserved_pages),
                     "max_reserved_pages": str(cfg.max_reserved_pages)}
        cuda = cfg.device != "cpu"
        engines.append(rig.engine(
            name, "gpu" if cuda else "host", model, py, root, elastic=mode == "elastic",
            knobs=knobs, env=env, max_num_seqs=cfg.max_num_seqs,
            max_model_len=cfg.prompt_len + cfg.output_len + 64, prefix_caching=False,
            num_gpu_blocks=cfg.blocks(mode), block_size=cfg.block_size,
            kv_cache_bytes=cfg.blocks(mode) * cfg.block_bytes if cuda else None,
            max_num_batched_tokens=cfg.max_batched_tokens, load_format="dummy",
            cuda_graphs=cfg.cuda_graphs and cuda, gpu_memory_utilization=0.2 if cuda else 0.3))
    return engines


def start(cfg: VllmColoConfig, modes: tuple[str, ...], model: str, py: str, root: Path,
          log: Callable[[str], None] = print) -> tuple[dict[str, list], dict]:
    """:func:`start_once`; where that fails, or its warm-up loses a request, once more without
    step logs (the recorder only observes: the sweep must not hang on it), then once more
    eager (both modes alike)."""
    for attempt in range(3):
        try:
            clusters, info = start_once(cfg, modes, model, py, root)
            lost = sum(w["lost"] for w in info.get("warmup", {}).values())
            if not lost:
                return clusters, info
            for es in clusters.values():
                for e in es:
                    e.close()
            err: Exception = RuntimeError(f"warm-up lost {lost} requests")
        except Exception as exc:
            err = exc
        if attempt == 0 and cfg.step_logs and _step_log_knob():
            cfg.step_logs = False
            what = "without step logs"
        elif cfg.cuda_graphs and cfg.device != "cpu":
            cfg.cuda_graphs = False
            what = "eager (no CUDA graphs)"
        else:
            raise err
        log(f"start-up failed ({' '.join(str(err).split())[:400]}); again {what}")
    raise AssertionError("unreachable")


def start_once(cfg: VllmColoConfig, modes: tuple[str, ...], model: str, py: str,
               root: Path) -> tuple[dict[str, list], dict]:
    """Every engine of ``modes`` started side by side; one clock for all of them; what the
    device's free memory and each engine's log said about start-up."""
    (root / "steps").mkdir(exist_ok=True)
    free0 = rig.device_free(cfg.device)
    t = time.monotonic()
    clusters = {m: make_engines(cfg, m, model, py, root) for m in modes}
    rig.start_all([e for m in modes for e in clusters[m]])
    t0 = time.monotonic()
    for m in modes:
        for e in clusters[m]:
            e.t0 = t0  # one clock: every instance's arrivals on the same time line
    info = {"modes": list(modes), "start_s": round(t0 - t, 1), "free_before": free0,
            "free_after": rig.device_free(cfg.device),
            "engines": {e.name: rows.startup_facts(e) for m in modes for e in clusters[m]}}
    if cfg.warmup_peak:  # first-use costs (kernel compiles, allocator growth) off the record
        info["warmup"] = {}
        for m in modes:
            w = run_point(cfg, clusters[m], m, cfg.warmup_peak, root)
            info["warmup"][m] = {"ttft_mean": w["overall"]["ttft"]["mean"],
                                 "finished": w["overall"]["finished"], "wall_s": w["wall_s"],
                                 "lost": w["lost"] + w["overall"]["requests"]
                                 - w["overall"]["finished"], "errors": w["errors"]}
    return clusters, info


def run_point(cfg: VllmColoConfig, engines: list, mode: str, peak: int, root: Path) -> dict:
    """One (PEAK, mode) point on running engines: every instance its ramp, on one clock."""
    pre = [rig.counters(e).get("num_preemptions", 0.0) for e in engines]
    marks = [rows.step_mark(root, e.name) for e in engines]
    base = engines[0].clock() + 0.5
    reqs = []
    for e, trace in zip(engines, traces(cfg, peak), strict=True):
        rid0 = len(e.requests)
        batch = [Request(rid0 + r.rid, r.prompt, r.max_new_tokens, base + r.arrival, r.group)
                 for r in trace]
        e.submit(batch)
        reqs.append(batch)
    until = base + cfg.run_seconds(peak) + cfg.drain_s
    for e in engines:
        e.advance(until)
    wall = engines[0].clock() - base
    time.sleep(0.5)  # the last frees reach the pools before the next point
    post = [rig.counters(e).get("num_preemptions", 0.0) for e in engines]
    return rows.point_result(engines, reqs, base, wall, [b - a for a, b in zip(pre, post,
                                                                               strict=True)],
                             [rows.read_steps(root, e.name, m, base)
                              for e, m in zip(engines, marks, strict=True)],
                             mode=mode, peak=peak)


def run(cfg: VllmColoConfig, log: Callable[[str], None] = print) -> list[dict]:
    """The sweep: per repeat, per PEAK, every mode in the repeat's order (``together``), or per
    repeat, per mode, every PEAK on freshly started engines. One raw dict per repeat, each
    rewritten to ``out_dir`` after every point, so a run cut short keeps what it finished."""
    py = rig.python_for("colocation")
    root = rig.workroot()
    t_begin = time.monotonic()
    tok = rig.model_dir(py, root)
    model = str(shapes.write(root / f"{cfg.model}-dummy", tok, cfg.model))
    head = {"config": {**asdict(cfg), "engine": "vllm", "block_bytes": cfg.block_bytes,
                       "budget_bytes": cfg.budget_bytes,
                       "blocks": {m: cfg.blocks(m) for m in cfg.modes}},
            "device": rows.device_name(cfg.device), "engine": "vllm",
            "provenance": rows.provenance()}
    reps: list[dict] = []
    live: dict[str, list] = {}

    def late(peak: int) -> bool:
        left = cfg.deadline_s is None or (time.monotonic() - t_begin + 1.5 * cfg.run_seconds(
            peak) + 10 <= cfg.deadline_s)
        return not left

    try:
        if cfg.together:
            live, info = start(cfg, cfg.modes, model, py, root, log)
            head["startup"] = [info]
        for r in range(cfg.first_repeat, cfg.first_repeat + cfg.repeats):
            rep = {**head, "repeat": r, "order": list(cfg.mode_order(r)), "runs": {}}
            rep["startup"] = list(head.get("startup", []))
            reps.append(rep)
            plan = ([(p, m) for p in cfg.peaks for m in rep["order"]] if cfg.together else
                    [(p, m) for m in rep["order"] for p in cfg.peaks])
            for peak, mode in plan:
                if late(peak):
                    log(f"repeat {r} PEAK {peak} {mode}: skipped, past deadline_s")
                    continue
                if mode not in live:  # per repeat and mode: its own engines
                    for es in live.values():
                        for e in es:
                            e.close()
                    live, info = start(cfg, (mode,), model, py, root, log)
                    rep["startup"].append(info)
                res = run_point(cfg, live[mode], mode, peak, root)
                rep["runs"][f"{peak}/{mode}"] = res
                rep["vllm_version"] = rows.vllm_version(live[mode])
                rep["step_logs"] = cfg.step_logs and _step_log_knob() is not None
                write_repeat(cfg.out_dir, rep)
                log(rows.point_line(r, peak, mode, res))
                if not cfg.together and (peak, mode) == [x for x in plan if x[1] == mode][-1]:
                    for e in live.pop(mode):
                        e.close()
    finally:
        for es in live.values():
            for e in es:
                e.close()
        shutil.rmtree(root, ignore_errors=True)
    return reps
