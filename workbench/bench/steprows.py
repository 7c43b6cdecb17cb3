"""Real engine steps as the step-time fit's rows: read from step logs (the JSON lines an engine
appends under ``WORKBENCH_KV_STEP_LOG``) or from a real colocation record's per-point steps.

Three corrections turn logged steps into what a single-engine step-time model describes:

* **own time**: with async scheduling a step is scheduled before the one ahead of it has been
  processed, so logged intervals overlap; a step's own time runs from the end of the step before
  (or its own start, after an idle gap) to its end;
* **solo**: on a shared GPU a step that overlaps another engine's step waits for that engine's
  kernels too; the fit takes, by default, only the steps during which no other engine of the same
  point stepped (the simulator adds the sharing itself);
* **context**: a log or record without ``ctx_tokens``/``attn_pairs`` (the record keeps the five
  core fields) gets them estimated from the workload's prompt and output lengths: a decode token
  reads on average ``prompt + output / 2`` tokens of KV, a whole-prompt prefill token
  ``(prompt + 1) / 2`` query-key pairs.
"""

from __future__ import annotations

import bisect
import gzip
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from workbench.errors import ConfigError
from workbench.strictjson import loads

CORE = ("t", "dur_s", "prefill_tokens", "decode_tokens", "seqs")
COUNTS = ("prefill_tokens", "decode_tokens", "seqs", "ctx_tokens", "attn_pairs")
LOG_FIX = "keep the lines the step recorder wrote (one JSON object per line), or remove this one"


class Step(NamedTuple):
    t: float  # wall time at the step's schedule start
    dur_s: float  # until its output was processed (overlaps the next step under async scheduling)
    prefill: int
    decode: int
    seqs: int
    ctx: float | None = None  # KV tokens read; None: not logged
    pairs: float | None = None  # query-key pairs; None: not logged

    @property
    def end(self) -> float:
        return self.t + self.dur_s


@dataclass(frozen=True, slots=True)
class Workload:
    """What the context estimate needs when a step does not carry its own."""

    prompt_len: int
    output_len: int

    def ctx(self, s: Step) -> float:
        return s.decode * (self.prompt_len + self.output_len / 2)

    def pairs(self, s: Step) -> float:
        return s.decode * (self.prompt_len + self.output_len / 2 + 1) + \
            s.prefill * (self.prompt_len + 1) / 2


def _number(d: dict, key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(where, f"{key} is {'missing' if v is None else 'not a number >= 0'}",
                          LOG_FIX)
    if key in COUNTS[:3] and v != int(v):
        raise ConfigError(where, f"{key} is not a whole count", LOG_FIX)
    return v


def parse_line(text: str, where: str) -> Step:
    """One logged step, or a one-line ConfigError naming ``where`` (file and line number)."""
    try:
        d = loads(text)
    except ValueError as err:
        raise ConfigError(where, f"is not JSON ({ascii(str(err))[1:-1][:60]})", LOG_FIX) from None
    if not isinstance(d, dict):
        raise ConfigError(where, "is not a JSON object", LOG_FIX)
    return parse_line_dict(d, where)


def read_log(path: str | Path) -> list[Step]:
    """Every step of one engine's log; the first bad line refused with its number."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="strict")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"step log {p}", f"cannot be read ({type(err).__name__})",
                          "pass a file the step recorder wrote") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(parse_line(line, f"step log {p} line {i}"))
    if not out:
        raise ConfigError(f"step log {p}", "holds no steps", "pass a log of a run that served")
    return out


def own_times(steps: list[Step]) -> list[float]:
    """Each step's own seconds: from the end of the step before (or its own start) to its end."""
    out, prev_end = [], -math.inf
    for s in sorted(steps, key=lambda s: s.t):
        out.append(max(s.end - max(s.t, prev_end), 0.0))
        prev_end = max(prev_end, s.end)
    return out


def own_spans(steps: list[Step]) -> list[tuple[float, float]]:
    """Each step's own interval (time order): its own time, ending where it ended."""
    ordered = sorted(steps, key=lambda s: s.t)
    return [(s.end - own, s.end) for s, own in zip(ordered, own_times(ordered), strict=True)]


def is_async(steps: list[Step]) -> bool:
    """Most steps were scheduled before the step ahead of them had been processed."""
    o = sorted(steps, key=lambda s: s.t)
    return sum(b.t < a.end for a, b in zip(o, o[1:], strict=False)) > len(o) / 2


def next_prefill(steps: list[Step]) -> list[bool]:
    """Per step (time order): whether the step after it carries a prefill. Under async
    scheduling the engine prepares and launches that step before it processes this one's
    output, so the host cost of a prefill (an eager, launch-bound forward) lands in the period
    of the step before it."""
    o = sorted(steps, key=lambda s: s.t)
    return [b.prefill > 0 for b in o[1:]] + [False]


def solo_mask(engines: list[list[Step]]) -> list[list[bool]]:
    """Per engine, per step (in time order): True when no other engine's step overlapped its
    own interval."""
    spans = [own_spans(e) for e in engines]
    out = []
    for i, mine in enumerate(spans):
        others = sorted(x for j, sp in enumerate(spans) if j != i for x in sp)
        mask, k, reach = [], 0, -math.inf  # reach: the latest end among others started so far
        for a, b in mine:
            while k < len(others) and others[k][0] < b:
                reach = max(reach, others[k][1])
                k += 1
            # an overlap: some other step started before b and ended after a
            mask.append(not reach > a)
        out.append(mask)
    return out


def fit_rows(engines: list[list[Step]], workload: Workload | None, *,
             solo: bool = True) -> list[list[float]]:
    """The fit's rows ``[num_seqs, new_tokens, ctx_tokens, attn_pairs, seconds, prefill_host]``
    of one point's engines (several when they shared a GPU); ``solo``: only steps no other
    engine overlapped. ``prefill_host``: the row's period holds a prefill's host cost (its own
    prefill; under async scheduling the next step's, see :func:`next_prefill`)."""
    masks = solo_mask(engines) if solo and len(engines) > 1 else \
        [[True] * len(e) for e in engines]
    rows = []
    for steps, mask in zip(engines, masks, strict=True):
        ordered = sorted(steps, key=lambda s: s.t)
        host = next_prefill(ordered) if is_async(ordered) else [s.prefill > 0 for s in ordered]
        for s, own, keep, pre in zip(ordered, own_times(ordered), mask, host, strict=True):
            if not keep or s.seqs == 0 or own <= 0:
                continue
            if s.ctx is None or s.pairs is None:
                if workload is None:
                    raise ConfigError("steps without ctx_tokens", "need the workload's lengths",
                                      "pass --prompt-len and --output-len")
                ctx, pairs = workload.ctx(s), workload.pairs(s)
            else:
                ctx, pairs = s.ctx, s.pairs
            rows.append([s.seqs, s.prefill + s.decode, ctx, pairs, own, float(pre)])
    return rows


def _opened(path: Path) -> Any:
    raw = path.read_bytes()
    return loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def repeats_of(obj: Any) -> list[dict]:
    """The repeat dicts (each with ``runs``) of a repeat file or a merged record."""
    if isinstance(obj, dict) and isinstance(obj.get("runs"), dict):
        return [obj]
    if isinstance(obj, dict):
        for key in ("repeats", "reps"):
            if isinstance(obj.get(key), list):
                return [r for r in obj[key] if isinstance(r, dict) and "runs" in r]
    if isinstance(obj, list):
        return [r for r in obj if isinstance(r, dict) and "runs" in r]
    return []


def load_record(path: str | Path) -> list[dict]:
    """Repeats of a record file (JSON, gzip'd or not) or of a folder of ``repeat_*.json``."""
    p = Path(path)
    files = sorted(p.glob("repeat_*.json")) if p.is_dir() else [p]
    reps: list[dict] = []
    for f in files:
        try:
            reps += repeats_of(_opened(f))
        except (OSError, ValueError) as err:
            raise ConfigError(f"record {f}", f"cannot be read ({type(err).__name__})",
                              "pass a colocation record or repeat file") from None
    if not reps:
        raise ConfigError(f"record {p}", "holds no repeats with runs",
                          "pass a real colocation sweep's record, repeat file or out_dir")
    return reps


def record_steps(rep: dict, key: str) -> list[list[Step]] | None:
    """The engines' steps of one point (``"PEAK/mode"``) of one repeat, absolute times; None when
    the point kept none. Rows follow the point's own ``fields`` list."""
    got = rep["runs"][key].get("steps")
    if not got:
        return None
    engines = []
    for i, e in enumerate(got):
        if not e or not e.get("rows"):
            engines.append([])
            continue
        fields, t0 = list(e["fields"]), float(e["t0"])
        idx = {f: fields.index(f) for f in CORE}
        opt = {f: fields.index(f) for f in ("ctx_tokens", "attn_pairs") if f in fields}
        where = f"repeat {rep.get('repeat')} point {key} engine {i}"
        steps = []
        for k, r in enumerate(e["rows"]):
            d = {f: r[j] for f, j in {**idx, **opt}.items()}
            d["t"] = t0 + d["t"]
            steps.append(parse_line_dict(d, f"{where} step {k}"))
        engines.append(steps)
    return engines


def parse_line_dict(d: dict, where: str) -> Step:
    """One step from its fields (a log line's object or a record row), checked."""
    t, dur, p, dec, n = (_number(d, k, where) for k in CORE)
    extra = [_number(d, k, where) if k in d else None for k in ("ctx_tokens", "attn_pairs")]
    return Step(t, dur, int(p), int(dec), int(n), *extra)


def workload_of(rep: dict) -> Workload | None:
    c = rep.get("config") or {}
    if "prompt_len" not in c:
        return None
    out = c.get("output_len") or max(2, round(c["completion_len"] / c.get("time_scale", 1.0)))
    return Workload(int(c["prompt_len"]), int(out))


def prefill_gpu_share(points: list[list[list[Step]]]) -> dict | None:
    """How much of another engine's prefill period holds the GPU, read from decode periods of
    engines sharing it: ``base`` (the others idle) against ``beside`` (exactly one other in a
    period that holds a prefill's cost). A simulator whose GPU serves whole steps in turn
    reproduces the delay those decodes suffered if the prefill holds the GPU for
    ``(beside - base) * period / beside`` seconds; None with too few periods of either kind."""
    base, beside, periods = [], [], []
    for a, b, s, h, others in _periods(points):
        if h:
            periods.append(b - a)
        if s.prefill or h:
            continue
        if all(o == "-" for o in others):
            base.append(b - a)
        elif sorted(others)[-1] == "H" and others.count("-") == len(others) - 1:
            beside.append(b - a)
    if len(base) < 20 or len(beside) < 20 or not periods:
        return None
    mb, mh, mp = (float(sorted(x)[len(x) // 2]) for x in (base, beside, periods))
    return {"base_s": mb, "beside_s": mh, "prefill_period_s": mp, "n_base": len(base),
            "n_beside": len(beside), "gpu_s": max(mh - mb, 0.0) * mp / mh}


def _periods(points: list[list[list[Step]]]):
    """Every step period of every engine of every point: ``(start, end, step, holds a prefill's
    host cost, the other engines' states at its middle)``."""
    for engines in points:
        spans = [own_spans(e) for e in engines]
        orders = [sorted(e, key=lambda s: s.t) for e in engines]
        host = [next_prefill(o) if is_async(o) else [s.prefill > 0 for s in o] for o in orders]
        for i in range(len(engines)):
            for (a, b), s, h in zip(spans[i], orders[i], host[i], strict=True):
                others = [_state_at(spans[j], host[j], (a + b) / 2)
                          for j in range(len(engines)) if j != i]
                yield a, b, s, h, others


def _state_at(spans: list[tuple[float, float]], host: list[bool], t: float) -> str:
    """An engine at time ``t``: "-" idle, "D" in a decode period, "H" in a prefill's period."""
    k = bisect.bisect(spans, (t, math.inf)) - 1
    if k < 0 or not spans[k][0] <= t <= spans[k][1]:
        return "-"
    return "H" if host[k] else "D"


def gpu_switch(points: list[list[list[Step]]], max_seqs: int = 4) -> dict | None:
    """What the GPU's turn between engines costs, read from decode periods of small batches
    (``<= max_seqs`` sequences: every engine's step then sits near the weight-streaming floor,
    so a step of another engine lasts about as long as one's own): alone, a period is one step
    (``base``); beside ``k`` other engines decoding (none in a prefill), a round of ``k + 1``
    steps and ``k + 1`` turns. Each turn costs ``(beside_k - (k + 1) * base) / (k + 1)``;
    the estimate pools ``k = 1, 2`` by their periods. None with too few periods."""
    base, beside = [], {1: [], 2: []}
    for a, b, s, h, others in _periods(points):
        if s.prefill or h or s.seqs > max_seqs or "H" in others:
            continue
        k = others.count("D")
        (base if k == 0 else beside.setdefault(k, [])).append(b - a)
    ks = [k for k in (1, 2) if len(beside[k]) >= 20]
    if len(base) < 20 or not ks:
        return None
    mb = float(sorted(base)[len(base) // 2])
    est = {k: (float(sorted(beside[k])[len(beside[k]) // 2]) - (k + 1) * mb) / (k + 1)
           for k in ks}
    n = sum(len(beside[k]) for k in ks)
    switch = sum(est[k] * len(beside[k]) for k in ks) / n
    return {"switch_s": max(switch, 0.0), "base_s": mb, "n_base": len(base),
            **{f"beside{k}_s": est[k] * (k + 1) + (k + 1) * mb for k in ks},
            **{f"n_beside{k}": len(beside[k]) for k in ks}}
