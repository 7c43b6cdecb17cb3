"""The colocation lab's ``server`` runner: ``instances`` real vLLM servers of one model shape
(random weights, ``--load-format dummy``), each in its own process on one device, under
kvcached's staggered ramp, and what a point and a repeat file keep; the repeats become the lab's
run in :mod:`~workbench.labs.colocation.server_run`.

* ``static``: stock vLLM, each a fixed ``1/instances`` of the KV total
  (``num_gpu_blocks_override``);
* ``elastic``: autopatched vLLM, each able to address the whole total, every map charged to one
  ``WORKBENCH_KV_GPU_BUDGET`` of that total shared by the processes (a map past it is a miss);
* ``kvcached``: stock vLLM under kvcached 0.1.6's own autopatch
  (:mod:`workbench.engines.real.kvcached`), each able to address the whole total, capped at it by
  a ballast this process holds; a start-up whose log lacks one of kvcached's patches, or that
  fails, is recorded as not run with its error (never replaced by another mode).

Two settings: ``compressed`` (kvcached's ramp time-compressed, a 2 GiB total) and ``kvcached``
(its trace as its script sends it, unscaled, and the KV its A100-80G run left beside three
weight sets, :func:`~workbench.engines.real.kvcached_budget.setting_budget`); there one mode's
engines run at a time (nine 8B weight sets do not fit one card).

Both modes skip vLLM's memory profiling (``kv_cache_memory_bytes``), so engines started side by
side cannot misread each other's weights as their own. ``together``: both modes' engines are
started once and kept for the whole sweep (one start-up instead of one per repeat and mode);
else per repeat, per mode, its engines start, serve every PEAK, and close. Arrival times are
divided by ``time_scale`` and completions shortened to ``completion_len / time_scale``; TTFT is
the streaming client's (first token - scheduled arrival, queueing and HTTP included). Each
repeat's raw JSON is rewritten to ``out_dir`` after every point.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.backends import capabilities
from workbench.engines.metrics import summarize
from workbench.engines.real import kvcached, shapes
from workbench.engines.real.kvcached_budget import setting_budget
from workbench.engines.sched.request import Request
from workbench.engines.sim.workloads import kvcached_ramp_delay, kvcached_ramp_traces, ramp_trace
from workbench.labs.colocation.params import (
    PAIR,
    ColocationParams,
    sweep_modes,
)
from workbench.labs.kit import server_rig as rig
from workbench.labs.kit.kvcached import PEAKS as KVCACHED_PEAKS
from workbench.outfiles import write_repeat
from workbench.units import GiB, MiB


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
    modes: tuple[str, ...] = PAIR
    setting: str = "compressed"  # or "kvcached": its unscaled trace (time_scale 1)
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
        """A static engine's third of the total; an elastic or kvcached one may address all."""
        total = self.budget_bytes // self.block_bytes
        return total // self.instances if mode == "static" else total

    def mode_order(self, repeat: int) -> tuple[str, ...]:
        return self.modes if repeat % 2 == 0 else tuple(reversed(self.modes))

    def run_seconds(self, peak: int) -> float:
        """The last arrival of a point (scaled), a guide to how long it runs. kvcached's script:
        every model's last request comes instances * delay + 2 * PEAK - 2 s in (model i starts
        at i * delay, its ramp's last request 2 * PEAK - 2 s later, then (N - i) * delay more)."""
        if self.setting == "kvcached":
            return self.instances * kvcached_ramp_delay(peak) + 2 * peak - 2
        return (8.75 * peak - 1) / self.time_scale


def traces(cfg: VllmColoConfig, peak: int) -> list[list[Request]]:
    """Per instance: kvcached's ramp at ``peak`` (time-compressed, or as its script sends it at
    kvcached's setting), token ids the tokenizer has."""
    span = rig.VOCAB_HI - rig.VOCAB_LO
    if cfg.setting == "kvcached":
        per = kvcached_ramp_traces(peak, cfg.instances, prompt_len=cfg.prompt_len,
                                   output_len=cfg.output_len, seed=cfg.seed)
    else:
        per = [ramp_trace(peak, i, num_models=cfg.instances, prompt_len=cfg.prompt_len,
                          output_len=cfg.output_len, seed=cfg.seed)
               for i in range(cfg.instances)]
    return [[Request(r.rid, [rig.VOCAB_LO + t % span for t in r.prompt], cfg.output_len,
                     r.arrival / cfg.time_scale, r.group) for r in reqs] for reqs in per]


def _step_log_knob() -> str | None:
    """The step-log knob's variable where this checkout knows it (engines append one JSON line
    per scheduler step there), else None: no step logs."""
    from workbench.knobs import KNOBS
    from workbench.settings import var

    return var("step_log") if "step_log" in KNOBS else None


def spec_fields(cfg: VllmColoConfig, mode: str) -> dict:
    """The spec fields every mode's engines share (the KV sized for ``mode``)."""
    cuda = cfg.device != "cpu"
    return dict(max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.prompt_len + cfg.output_len + 64,
                prefix_caching=False, num_gpu_blocks=cfg.blocks(mode), block_size=cfg.block_size,
                kv_cache_bytes=cfg.blocks(mode) * cfg.block_bytes if cuda else None,
                max_num_batched_tokens=cfg.max_batched_tokens, load_format="dummy",
                cuda_graphs=cfg.cuda_graphs and cuda, gpu_memory_utilization=0.2 if cuda else 0.3)


def make_engines(cfg: VllmColoConfig, mode: str, model: str, py: str, root: Path) -> list:
    """``mode``'s engines, not started: kvcached's under its own interpreter and switches (no
    workbench knob, no step log: kvcached's process runs none of the workbench's code)."""
    if mode == "kvcached":
        return [kvcached.engine(f"{mode}{i}", model, root, device=cfg.device,
                                **spec_fields(cfg, mode)) for i in range(cfg.instances)]
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
        engines.append(rig.engine(
            name, "gpu" if cfg.device != "cpu" else "host", model, py, root,
            elastic=mode == "elastic", knobs=knobs, env=env, **spec_fields(cfg, mode)))
    return engines


class KvcachedNotRun(Exception):
    """kvcached's engines did not run as kvcached: why, in its words, and what they said."""

    def __init__(self, reason: str, facts: list | None = None):
        super().__init__(reason)
        self.record = {"reason": reason, "engines": facts}


def start(cfg: VllmColoConfig, modes: tuple[str, ...], model: str, py: str, root: Path,
          log: Callable[[str], None] = print,
          ballast: kvcached.Ballast | None = None) -> tuple[dict[str, list], dict]:
    """:func:`start_once`; where that fails, or its warm-up loses a request, once more without
    step logs (the recorder only observes: the sweep must not hang on it), then once more
    eager (both modes alike). kvcached's engines get one try: a failure there is its result
    (:class:`KvcachedNotRun`), and an eager retry would change the other modes' setting."""
    if "kvcached" in modes:
        try:
            return start_once(cfg, modes, model, py, root,
                              kvcached.Ballast() if ballast is None else ballast)
        except KvcachedNotRun:
            raise
        except Exception as err:
            raise KvcachedNotRun(" ".join(str(err).split())[:2000]) from err
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
               root: Path, ballast: kvcached.Ballast | None = None
               ) -> tuple[dict[str, list], dict]:
    """Every engine of ``modes`` started side by side; one clock for all of them; what the
    device's free memory and each engine's log said about start-up (kvcached's: its facts and
    the ballast that caps it, :func:`kvcached_facts`, before its warm-up)."""
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
            "engines": {e.name: startup_facts(e) for m in modes for e in clusters[m]}}
    try:  # a failure past here closes what started (and lets go of kvcached's ballast)
        if "kvcached" in clusters:
            info["kvcached"] = kvcached_facts(cfg, clusters["kvcached"], ballast)
        if cfg.warmup_peak:  # first-use costs (kernel compiles, allocator growth) off the record
            info["warmup"] = {m: warm_up(cfg, clusters[m], m, root) for m in modes}
    except BaseException:
        close_all(clusters, ballast)
        raise
    return clusters, info


def warm_up(cfg: VllmColoConfig, engines: list, mode: str, root: Path) -> dict:
    """One unrecorded point at ``warmup_peak``: what the record keeps of it."""
    w = run_point(cfg, engines, mode, cfg.warmup_peak, root)
    return {"ttft_mean": w["overall"]["ttft"]["mean"], "finished": w["overall"]["finished"],
            "wall_s": w["wall_s"], "errors": w["errors"],
            "lost": w["lost"] + w["overall"]["requests"] - w["overall"]["finished"]}


def kvcached_facts(cfg: VllmColoConfig, engines: list, ballast: kvcached.Ballast | None,
                   mem_info=None) -> dict:
    """kvcached's engines once up: each one's facts, and the ballast that leaves them the
    sweep's budget. :class:`KvcachedNotRun` where a log lacks one of its essential patches, or
    where the card leaves kvcached less than that budget under its own headroom rule: every mode
    gets the same bytes, so kvcached on less would not be the setting (on an H100, three 8B
    engines left it 22.73 GiB of the 24.71 GiB kvcached's A100 run had)."""
    facts = [e.facts() for e in engines]
    missing = sorted({n for f in facts for n in f["patches"]["missing"]})
    if missing:
        raise KvcachedNotRun(f"kvcached {kvcached.VERSION} left vLLM partly stock: its log "
                             f"has no successful patch of {', '.join(missing)}", facts)
    cap = kvcached.cap_at_budget(engines, cfg.budget_bytes,
                                 ballast if ballast is not None else kvcached.Ballast(), mem_info)
    if cap["wanted"] < 0:
        raise KvcachedNotRun(
            f"this card leaves kvcached {gib(cap['kvcached_may_map'])} GiB to map under its "
            f"5 % headroom rule (device free {gib(cap['free_before'])} of "
            f"{gib(cap['total'])} GiB with its engines up), less than the "
            f"{gib(cfg.budget_bytes)} GiB every mode gets: run the setting on a card with "
            "more memory (an H200), or give every mode less (budget_gib)", facts)
    return {"engines": facts, "ballast": cap}


def gib(x) -> str:
    """Bytes as GiB with two decimals (``-`` for none), as the sweep's report writes them."""
    return "-" if x is None else f"{x / GiB:.2f}"


def close_all(live: dict[str, list], ballast: kvcached.Ballast | None = None) -> None:
    """Close every engine in ``live`` and let go of the ballast held for kvcached's."""
    for es in live.values():
        for e in es:
            e.close()
    if ballast is not None and "kvcached" in live:
        ballast.release()


def costs_since(before: list[dict], after: list[dict]) -> dict[str, list[float]]:
    """The per-page map costs (us) the engines logged during a point: each engine's log is
    cumulative, so its entries past the ones it held before."""
    out: dict[str, list[float]] = {"grow": [], "shrink": []}
    for b, a in zip(before, after, strict=True):
        for k, costs in out.items():
            costs.extend(round(x, 1) for x in a[k][len(b[k]):])
    return out


def run_point(cfg: VllmColoConfig, engines: list, mode: str, peak: int, root: Path) -> dict:
    """One (PEAK, mode) point on running engines: every instance its ramp, on one clock."""
    costs0 = [e.map_costs() for e in engines] if mode == "kvcached" else None
    pre = [rig.counters(e).get("num_preemptions", 0.0) for e in engines]
    marks = [step_mark(root, e.name) for e in engines]
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
    res = point_result(engines, reqs, base, wall,
                       [b - a for a, b in zip(pre, post, strict=True)],
                       [read_steps(root, e.name, m, base)
                        for e, m in zip(engines, marks, strict=True)], mode=mode, peak=peak)
    if costs0 is not None:
        res["map_costs"] = costs_since(costs0, [e.map_costs() for e in engines])
    return res


def sweep(cfg: VllmColoConfig, log: Callable[[str], None] = print) -> list[dict]:
    """The sweep: per repeat, per PEAK, every mode in the repeat's order (``together``), or per
    repeat, per mode, every PEAK on freshly started engines. One raw dict per repeat, each
    rewritten to ``out_dir`` after every point, so a run cut short keeps what it finished. A
    mode whose engines did not run (kvcached: :class:`KvcachedNotRun`) is tried once per call;
    every repeat records why under ``not_run``."""
    py = rig.python_for("colocation")
    root = rig.workroot()
    t_begin = time.monotonic()
    tok = rig.model_dir(py, root)
    model = str(shapes.write(root / f"{cfg.model}-dummy", tok, cfg.model))
    head = {"config": {**asdict(cfg), "engine": "vllm", "block_bytes": cfg.block_bytes,
                       "budget_bytes": cfg.budget_bytes,
                       "blocks": {m: cfg.blocks(m) for m in cfg.modes}},
            "device": device_name(cfg.device), "engine": "vllm",
            "provenance": provenance()}
    reps: list[dict] = []
    live: dict[str, list] = {}
    ballast = kvcached.Ballast()  # held while kvcached's engines run
    not_run: dict[str, dict] = {}

    def late(peak: int) -> bool:
        left = cfg.deadline_s is None or (time.monotonic() - t_begin + 1.5 * cfg.run_seconds(
            peak) + 10 <= cfg.deadline_s)
        return not left

    try:
        if cfg.together:
            live, info = start(cfg, cfg.modes, model, py, root, log, ballast)
            head["startup"] = [info]
        for r in range(cfg.first_repeat, cfg.first_repeat + cfg.repeats):
            rep = {**head, "repeat": r, "order": list(cfg.mode_order(r)), "runs": {}}
            rep["startup"] = list(head.get("startup", []))
            reps.append(rep)
            plan = ([(p, m) for p in cfg.peaks for m in rep["order"]] if cfg.together else
                    [(p, m) for m in rep["order"] for p in cfg.peaks])
            for peak, mode in plan:
                if late(peak) or mode in not_run:
                    why = "past deadline_s" if mode not in not_run else "its engines did not run"
                    log(f"repeat {r} PEAK {peak} {mode}: skipped, {why}")
                    rep["not_run"] = dict(not_run)
                    continue
                if mode not in live:  # per repeat and mode: its own engines
                    close_all(live, ballast)
                    live = {}
                    try:
                        live, info = start(cfg, (mode,), model, py, root, log, ballast)
                    except KvcachedNotRun as err:
                        not_run[mode] = {"repeat": r, **err.record}
                        rep["not_run"] = dict(not_run)
                        write_repeat(cfg.out_dir, rep)
                        log(f"repeat {r} {mode}: not run ({err.record['reason'][:400]})")
                        continue
                    rep["startup"].append(info)
                res = run_point(cfg, live[mode], mode, peak, root)
                rep["runs"][f"{peak}/{mode}"] = res
                rep["vllm_version"] = vllm_version(live[mode])
                rep["step_logs"] = cfg.step_logs and _step_log_knob() is not None
                write_repeat(cfg.out_dir, rep)
                log(point_line(r, peak, mode, res))
                if not cfg.together and (peak, mode) == [x for x in plan if x[1] == mode][-1]:
                    close_all({mode: live.pop(mode)}, ballast)
    finally:
        close_all(live, ballast)
        shutil.rmtree(root, ignore_errors=True)
    return reps


# -- what a point and a repeat file keep -----------------------------------------------------------

STEP_FIELDS = ("t", "dur_s", "prefill_tokens", "decode_tokens", "seqs")


def device_name(device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else device


def provenance() -> dict:
    """When, where and by which command a sweep ran (kept in every repeat file)."""
    import datetime
    import platform

    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": command_line(), "host_cpus": __import__("os").cpu_count(),
           "python": platform.python_version()}
    with contextlib.suppress(Exception):
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda)
    return out


def command_line() -> str:
    """The command this process runs, as a user typed it (``python -m workbench``: workbench)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):
        argv[0] = "workbench"
    return " ".join(argv)


def _log(e) -> str:
    try:
        return e.log.read_text(errors="replace")
    except OSError:
        return ""


def vllm_version(engines: list) -> str | None:
    """vLLM's version as its server logged it."""
    for e in engines:
        m = re.search(r"vLLM API server version (\S+)", _log(e)) or \
            re.search(r"version (\d+\.\d+\.\d+\S*)", _log(e))
        if m:
            return m.group(1)
    return None


def startup_facts(e) -> dict:
    """What one engine's log and control segment say after start-up: its KV size in tokens, the
    blocks, graph capture, the elastic pool's mapped bytes at idle."""
    text = _log(e)
    out: dict = {"elastic": e.spec.elastic, "blocks": e.spec.num_gpu_blocks,
                 "cuda_graphs": e.spec.cuda_graphs}
    for key, pat in (("kv_cache_tokens", r"GPU KV cache size: ([\d,]+) tokens"),
                     ("graph_capture_s", r"Graph capturing finished in ([\d.]+) sec"),
                     ("model_load_gib", r"Model loading took ([\d.]+) GiB"),
                     ("init_engine_s", r"init engine .* took ([\d.]+) sec")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1).replace(",", ""))
    out["eager"] = "--enforce-eager" in " ".join(e.spec.args(0, "x"))
    if e.spec.elastic:
        with contextlib.suppress(Exception):
            info = e.kv_pool.info()
            out.update(capacity=info.capacity, mapped_idle=info.mapped)
    return out


def step_mark(root: Path, name: str) -> int:
    p = root / "steps" / f"{name}.jsonl"
    return p.stat().st_size if p.exists() else 0


def read_steps(root: Path, name: str, mark: int, base: float) -> dict | None:
    """The steps one engine appended since ``mark``: ``t0`` (the first step's ``t``) and rows of
    :data:`STEP_FIELDS` with ``t`` made relative to it; None when it logs none."""
    p = root / "steps" / f"{name}.jsonl"
    if not p.exists():
        return None
    with p.open("rb") as f:
        f.seek(mark)
        lines = f.read().decode(errors="replace").splitlines()
    steps = []
    for ln in lines:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            d = json.loads(ln)
            steps.append([float(d["t"]), round(float(d["dur_s"]), 6), int(d["prefill_tokens"]),
                          int(d["decode_tokens"]), int(d["seqs"])])
    if not steps:
        return {"t0": None, "fields": list(STEP_FIELDS), "rows": []}
    t0 = steps[0][0]
    for s in steps:
        s[0] = round(s[0] - t0, 4)
    return {"t0": t0, "fields": list(STEP_FIELDS), "rows": steps}


def _mapped(engines: list, lo: float, hi: float, every: float = 0.25) -> tuple[list, int]:
    """[t, mapped MiB per engine] every ``every`` s of the point, and the peak of their sum on
    that grid (bytes)."""
    series = [[(s.t - lo, s.mapped_bytes) for s in e.samples if lo <= s.t <= hi]
              for e in engines]
    if not any(series):
        return [], 0
    peak = 0
    rows, k = [], [0] * len(engines)
    t, last = 0.0, [0] * len(engines)
    while t <= hi - lo:
        for i, ser in enumerate(series):
            while k[i] < len(ser) and ser[k[i]][0] <= t:
                last[i] = ser[k[i]][1]
                k[i] += 1
        peak = max(peak, sum(last))
        rows.append([round(t, 2)] + [round(x / 2**20) for x in last])
        t += every
    return rows, peak


def point_result(engines: list, reqs: list[list[Request]], base: float, wall: float,
                 preemptions: list[float], steps: list, *, mode: str, peak: int) -> dict:
    per = []
    for batch, pre in zip(reqs, preemptions, strict=True):
        d = summarize(batch).as_dict()
        d["preemptions"] = int(pre)
        per.append(d)
    overall = summarize([r for b in reqs for r in b]).as_dict()
    overall["preemptions"] = int(sum(preemptions))
    rows = [[k, round(r.arrival - base, 4),
             round(r.first_token - r.arrival, 4) if r.first_token is not None else None,
             round(r.finish - r.arrival, 4) if r.finish is not None else None, r.output_len]
            for k, b in enumerate(reqs) for r in b]
    lost = [e.outcome(r.rid).error for e, b in zip(engines, reqs, strict=True) for r in b
            if e.outcome(r.rid).error]
    free = [f for t, f in engines[0].free_samples if base <= t <= base + wall]
    timeline, mapped_peak = _mapped(engines, base, base + wall) if mode != "static" \
        else ([], 0)
    return {"mode": mode, "peak": peak, "wall_s": round(wall, 3), "overall": overall,
            "instances": per, "preemptions": [int(p) for p in preemptions],
            "requests": rows, "lost": len(lost), "errors": lost[:3],
            "free_start": free[0] if free else None, "free_min": min(free) if free else None,
            "mapped_timeline": timeline, "mapped_peak_bytes": mapped_peak if timeline else None,
            "steps": steps if any(s is not None for s in steps) else None}


def point_line(r: int, peak: int, mode: str, res: dict) -> str:
    o = res["overall"]
    return (f"repeat {r} PEAK {peak:3d} {mode:7s}: {o['finished']}/{o['requests']} done, TTFT "
            f"mean {o['ttft']['mean'] * 1e3:.1f} ms p99 {o['ttft']['p99'] * 1e3:.1f} ms, "
            f"preemptions {o['preemptions']}, wall {res['wall_s']:.1f} s, lost {res['lost']}")


# -- the lab's runner ------------------------------------------------------------------------------

GPU_PEAKS = (2, 4, 7, 10, 14)  # low load, near the static split's knee, past it, overload
HOST_PEAKS = (1, 2)


def config_for(params: ColocationParams, backend: str) -> VllmColoConfig:
    cuda = capabilities(backend).cuda
    cfg = VllmColoConfig(
        model=params.model or ("llama-3.1-8b" if cuda else "host"),
        budget_gib=params.budget_gib, time_scale=params.time_scale,
        prompt_len=params.prompt_len, completion_len=params.completion_len, seed=params.seed,
        repeats=params.repeats, first_repeat=params.first_repeat, out_dir=params.out_dir,
        device="cuda" if cuda else "cpu", cuda_graphs=params.cuda_graphs is not False,
        together=cuda if params.together is None else params.together,
        deadline_s=params.deadline_s, peaks=tuple(params.peaks or
                                                  (GPU_PEAKS if cuda else HOST_PEAKS)))
    cfg.modes = sweep_modes(params)
    if "kvcached" in cfg.modes:  # kvcached caps itself by the device's free memory: alone
        cfg.together = False
    if params.setting == "kvcached":
        kvcached_setting(cfg, params)
    if not cuda:  # a smoke run on the CPU: few, short requests
        cfg.max_num_seqs, cfg.max_batched_tokens = 16, 512
    if params.quick:
        cfg.peaks = cfg.peaks[:2]
    return cfg


def kvcached_setting(cfg: VllmColoConfig, params: ColocationParams) -> None:
    """kvcached's own setting on ``cfg``: its trace unscaled, the KV its A100-80G run left
    beside three weight sets, vLLM's serving defaults there (256 sequences, 2048 batched
    tokens), and one mode's engines at a time."""
    cfg.setting, cfg.time_scale = "kvcached", 1.0
    cfg.budget_gib = setting_budget().total_bytes / GiB
    cfg.max_num_seqs, cfg.max_batched_tokens = 256, 2048
    cfg.together = False
    if not params.peaks:
        cfg.peaks = KVCACHED_PEAKS  # the PEAKs of kvcached's published table
