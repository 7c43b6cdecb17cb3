"""Steady decode: step time with and without CUDA graphs, its bandwidth floor, VMM / static.

For each batch size, engines stay alive with ``batch`` sequences decoding (prefilled once, long
``max_tokens``). The subjects are ``vmm``/``static`` block-style KV, each with decode graphs on and
off, plus the token style (``req_to_token``) on VMM with graphs. A round runs each mode in turn
(the order reversed every other round); within a mode, VMM and static alternate step by step in
ABBA order, so a transient slowdown of the machine (seen: two rounds of one H200 run where every
subject slowed by 5-100%) lands on both sides of a ratio instead of on whichever subject held the
GPU at the time. All subjects see the same contexts (growing by one token a step in lockstep).

Reported per subject: the engine step's wall time (scheduler, input copies, forward, sampling,
one sync) and the forward alone (CUDA events), as median / p10 / p90 / n over steps; each step's
bandwidth floor, ``(weights + KV read + KV written) / 4.3 TB/s`` computed from the geometry (4.3
TB/s is the H200's measured device copy bandwidth, ``bench vmm_bw``) and the step / floor ratio;
and per round, VMM / static decode throughput (static step median / VMM step median), also of
the forward alone (``graphs-forward``: the device work without the host's share of the step).
"""

from __future__ import annotations

import statistics
import time

from workbench.bench import decode_kernel, stepprof
from workbench.bench.mini import _engine
from workbench.bench.stats import PausedGC
from workbench.bench.stats import deciles as spread
from workbench.mini.engine import Engine, StepStats
from workbench.mini.model import ModelConfig
from workbench.units import GiB

COPY_BYTES_PER_S = 4.3e12  # H200, measured device-to-device copy bandwidth
SUBJECTS = (("vmm", "block", True), ("static", "block", True), ("vmm", "block", False),
            ("static", "block", False), ("vmm", "token", True))


def weight_bytes(cfg: ModelConfig) -> int:
    """bf16 bytes a decode step reads for weights: every matrix and norm once; the embedding
    table only by the batch's rows (counted with the batch)."""
    return 2 * (cfg.params - cfg.vocab_size * cfg.hidden_size)


def floor_bytes(cfg: ModelConfig, batch: int, context_tokens: int) -> int:
    """One decode step's least traffic: weights, embedding rows, the KV of every position read
    (``context_tokens`` before the step plus each new token) and the new tokens' K/V written."""
    kv_read = (context_tokens + batch) * cfg.kv_bytes_per_token
    return (weight_bytes(cfg) + 2 * batch * cfg.hidden_size + kv_read
            + batch * cfg.kv_bytes_per_token)


def floor_seconds(cfg: ModelConfig, batch: int, context_tokens: int) -> float:
    return floor_bytes(cfg, batch, context_tokens) / COPY_BYTES_PER_S


def _fill(eng: Engine, cfg: ModelConfig, batch: int, prompt_len: int, gen: int,
          salt: int) -> None:
    """Admit ``batch`` prompts and step until a step decodes all of them and nothing else."""
    for i in range(batch):
        eng.add_request([(i * 131 + j * 7 + salt) % cfg.vocab_size for j in range(prompt_len)],
                        gen)
    while True:
        eng.step()
        s = eng.stats.steps[-1]
        if s.num_decode == batch and s.num_prefill_tokens == 0:
            return


def _turns(subjects: list[tuple[Engine, bool]], k: int, flip: bool) -> list[list[StepStats]]:
    """``k`` steps of each subject, taking turns one step at a time in ABBA order."""
    got: list[list[StepStats]] = [[] for _ in subjects]
    idx = list(range(len(subjects)))
    for i in range(k):
        for j in (idx if (i % 2 == 0) != flip else idx[::-1]):
            eng, graphs = subjects[j]
            if eng.graphs is not None:
                eng.graphs.enabled = graphs
            eng.step()
            got[j].append(eng.stats.steps[-1])
    return got


def _modes(subjects: list[tuple[str, str, bool]]) -> list[list[tuple[str, str, bool]]]:
    """Subjects grouped by (style, graphs): the VMM/static pairs, then the token style alone."""
    groups: dict[tuple[str, bool], list] = {}
    for sub in subjects:
        groups.setdefault((sub[1], sub[2]), []).append(sub)
    return list(groups.values())


def _steps(eng: Engine, graphs: bool, k: int) -> list[StepStats]:
    if eng.graphs is not None:
        eng.graphs.enabled = graphs
    eng.stats.steps.clear()
    for _ in range(k):
        eng.step()
    return list(eng.stats.steps)


def steady(model, cfg: ModelConfig, *, batch: int, prompt_len: int = 1024, rounds: int = 15,
           steps: int = 8, kv_gib: float = 24.0, deadline: float = float("inf"),
           profile: bool = False, log=print) -> dict:
    """One batch size: every subject, ``rounds`` interleaved rounds of ``steps`` steps each;
    with ``profile``, the step's measured parts too (:mod:`workbench.bench.stepprof`)."""
    on_cuda = next(model.parameters()).device.type == "cuda"
    subjects = [s for s in SUBJECTS if on_cuda or not s[2]]  # no graphs off CUDA
    gen = 8 + (rounds * 2 + 2) * steps  # never finishes while measured
    kv = int(kv_gib * GiB)
    engines: dict[tuple[str, str], Engine] = {}
    rows: dict[str, list[StepStats]] = {}
    # per round, static median / VMM median of the step (wall) and of the forward (events)
    # (graphs-half: the first half of each round's steps, to see what more steps per ratio buy)
    ratios: dict[str, list[float]] = {"graphs": [], "graphs-half": [], "eager": [],
                                      "graphs-forward": []}
    ctx = prompt_len + rounds * steps
    device_time = _device_time(model, cfg, batch, ctx) if on_cuda else {}
    prof: dict = {"device": stepprof.device_parts(model, cfg, batch, ctx)
                  if profile and on_cuda else None}
    try:
        for backend, style, _ in subjects:
            if (backend, style) not in engines:
                eng = engines[backend, style] = _engine(
                    model, cfg, backend, style, kv, max_num_seqs=batch, max_batched_tokens=8192,
                    graph_sizes=(batch,) if on_cuda else (), cuda_graphs=None)
                _fill(eng, cfg, batch, prompt_len, gen, salt=len(engines))
        for backend, style, graphs in subjects:  # capture, compile, settle: discarded
            _steps(engines[backend, style], graphs, 2)
        log(f"steady B={batch}: {len(engines)} engines filled (context {prompt_len})")
        for rnd in range(rounds):
            if time.perf_counter() > deadline:
                log(f"steady B={batch}: wall budget reached after {rnd} rounds")
                break
            med = _round(engines, subjects, steps, rnd, rows, ratios)
            log(f"steady B={batch} round {rnd}: " + ", ".join(
                f"{k} {1e3 * v:.2f}" for k, v in med.items()) + " ms")
        if profile:
            with PausedGC():
                prof["host"] = stepprof.host_split(engines["vmm", "block"], steps)
    finally:
        for eng in engines.values():
            eng.close()
    return {**_report(cfg, batch, prompt_len, rows, ratios), "device_time": device_time,
            "profile": prof}


def _round(engines: dict, subjects: list, steps: int, rnd: int,
           rows: dict[str, list[StepStats]], ratios: dict[str, list[float]]) -> dict[str, float]:
    """One round: every mode in turn, VMM and static alternating within it; appends each
    subject's steps to ``rows`` and the round's ratios to ``ratios``; the step medians."""
    modes = _modes(subjects)
    med, half, fwd = {}, {}, {}
    for group in (modes if rnd % 2 == 0 else modes[::-1]):
        with PausedGC():
            turns = _turns([(engines[b, st], g) for b, st, g in group], steps,
                           flip=rnd % 2 == 1)
        for (backend, style, graphs), got in zip(group, turns, strict=True):
            name = _name(backend, style, graphs)
            rows.setdefault(name, []).extend(got)
            med[name] = statistics.median(s.seconds for s in got)
            half[name] = statistics.median(s.seconds for s in got[:max(1, steps // 2)])
            fwd[name] = statistics.median(s.forward_seconds for s in got)
    for mode, on, m in (("graphs", True, med), ("graphs-half", True, half),
                        ("eager", False, med), ("graphs-forward", True, fwd)):
        v, s = m.get(_name("vmm", "block", on)), m.get(_name("static", "block", on))
        if v and s:  # forward times are 0 off CUDA
            ratios[mode].append(s / v)
    return med


def _device_time(model, cfg: ModelConfig, batch: int, ctx: int) -> dict:
    """Tile the paged kernel for this shape (both styles) and time the weights alone."""
    return {"ctx": ctx, "tiling_block": decode_kernel.tune(cfg, batch, ctx, 16, 16),
            "tiling_token": decode_kernel.tune(cfg, batch, ctx, 1, 1),
            "weights": decode_kernel.weight_stream(model, batch)}


def _name(backend: str, style: str, graphs: bool) -> str:
    return f"{backend}-{style}-{'graphs' if graphs else 'eager'}"


def _report(cfg: ModelConfig, batch: int, prompt_len: int, rows: dict[str, list[StepStats]],
            ratios: dict[str, list[float]]) -> dict:
    out = {"batch": batch, "prompt_len": prompt_len, "copy_bytes_per_s": COPY_BYTES_PER_S,
           "weight_bytes": weight_bytes(cfg), "kv_token_bytes": cfg.kv_bytes_per_token,
           "subjects": {}, "vmm_over_static": {m: {**spread(r), "rounds": r}
                                               for m, r in ratios.items()}}
    for name, st in rows.items():
        floors = [floor_seconds(cfg, s.num_decode, s.context_tokens) for s in st]
        out["subjects"][name] = {
            "step_s": spread([s.seconds for s in st]),
            "forward_s": spread([s.forward_seconds for s in st]),
            "floor_s": spread(floors),
            "step_over_floor": spread([s.seconds / f for s, f in zip(st, floors, strict=True)]),
            "forward_over_floor": spread([s.forward_seconds / f
                                          for s, f in zip(st, floors, strict=True)]),
            "graphed_steps": sum(s.graphed for s in st)}
    return out


def _ms(d: dict) -> str:
    if not d["n"]:
        return "n/a"
    return (f"{1e3 * d['median']:.3f} ms [p10 {1e3 * d['p10']:.3f}, p90 {1e3 * d['p90']:.3f}, "
            f"n={d['n']}]")


def _x(d: dict) -> str:
    if not d["n"]:
        return "n/a"
    return f"{d['median']:.3f} [p10 {d['p10']:.3f}, p90 {d['p90']:.3f}, n={d['n']}]"


def summary(res: dict) -> list[str]:
    w = res["weight_bytes"]
    lines = [f"steady B={res['batch']} (prompt {res['prompt_len']}): floor = (weights "
             f"{w / 1e9:.2f} GB + KV {res['kv_token_bytes']} B/token read and written) / "
             f"{res['copy_bytes_per_s'] / 1e12:.1f} TB/s (H200 measured copy bandwidth)"]
    for name, s in res["subjects"].items():
        lines.append(f"  {name:22s} step {_ms(s['step_s'])}; forward {_ms(s['forward_s'])}; "
                     f"floor {_ms(s['floor_s'])}")
        lines.append(f"  {'':22s} step/floor {_x(s['step_over_floor'])} (target <= 1.25); "
                     f"forward/floor {_x(s['forward_over_floor'])}")
    dt = res.get("device_time")
    if dt:
        lines.append(f"  device time at B={res['batch']}, context {dt['ctx']} (block, then token):")
        lines += decode_kernel.summary(dt["tiling_block"] + dt["tiling_token"], dt["weights"])
    prof = res.get("profile") or {}
    lines += stepprof.summary(prof.get("device"), prof.get("host"))
    for mode, r in res["vmm_over_static"].items():
        lines.append(f"  VMM/static decode ({mode}): {_x(r)} (target >= 0.99, p10..p90 within "
                     "+-3%); rounds " + ", ".join(f"{x:.4f}" for x in r["rounds"]))
    return lines
