"""What the colocation lab's real-vLLM runner keeps of one point and of start-up: per-instance and
overall summaries (vLLM's own preemption counter, not the client's), per-request rows, the KV the
elastic pools had mapped, the device's free memory, each engine's scheduler steps where its step
log exists; and the repeat files those land in."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

from workbench.engines.metrics import summarize
from workbench.engines.sched.request import Request

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
    import sys

    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):
        argv[0] = "workbench"
    out = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join(argv), "host_cpus": __import__("os").cpu_count(),
           "python": platform.python_version()}
    with contextlib.suppress(Exception):
        import torch

        out.update(torch=torch.__version__, cuda=torch.version.cuda)
    return out


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
    timeline, mapped_peak = _mapped(engines, base, base + wall) if engines[0].spec.elastic \
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
