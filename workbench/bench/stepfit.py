"""The step-time model fitted on measured steps (pure numpy): the two efficiencies by grid search,
the overheads by least squares at each grid point, on the *relative* error (steps span
milliseconds to seconds). ``calibrate`` feeds it the mini engine's steps, ``calibrate_real`` a
real engine's."""

from __future__ import annotations

import numpy as np

from workbench.engines.models import get_model
from workbench.engines.sim.steptime import GPUS


def _flops_bytes(rows: np.ndarray, model: str) -> tuple[np.ndarray, np.ndarray]:
    m = get_model(model)
    new, ctx, pairs = rows[:, 1], rows[:, 2], rows[:, 3]
    flops = 2.0 * m.active_params * new + 4.0 * m.num_layers * m.q_heads * m.attn_head_dim * pairs
    nbytes = m.weight_bytes + (ctx + new) * m.kv_bytes_per_token
    return flops, nbytes


def fit_steptime(steps: list[list[float]], gpu: str = "h200", model: str = "llama-3.1-8b",
                 trim: float = 0.5, prefill_term: bool = True) -> dict:
    """``steps``: rows of ``[num_seqs, new_tokens, ctx_tokens, attn_pairs, seconds]`` and
    optionally a sixth, ``prefill_host``: 1 where the step's time holds a prefill's host cost
    (default: the step has more new tokens than sequences); ``prefill_term``: fit
    ``prefill_overhead_s`` too (else it is 0).

    Fits once, drops steps more than ``trim`` (relative) off the fit, fits again: the first step
    of each new batch shape is 2-4x slower (cuBLAS/SDPA selection, allocator growth; seen on the
    H200), and those one-off costs are not what a step-time model describes."""
    rows = np.asarray([[*r[:5], r[5] if len(r) > 5 else float(r[1] > r[0])]
                       for r in steps if r[0] > 0], dtype=float)
    first = _fit(rows, gpu, model, prefill_term)
    keep = np.abs(first.pop("_rel")) <= trim
    out = _fit(rows[keep], gpu, model, prefill_term)
    out.pop("_rel")
    out["n_dropped"] = int((~keep).sum())
    return out


def _fit(rows: np.ndarray, gpu: str, model: str, prefill_term: bool = True) -> dict:
    flops, nbytes = _flops_bytes(rows, model)
    t, n = rows[:, 4], rows[:, 0]
    # a step with a prefill chunk (more new tokens than sequences) runs eagerly where the
    # decode-only steps replay CUDA graphs: its own host term (0 when steps are all eager)
    mixed = rows[:, 5] if prefill_term else np.zeros(len(rows))
    spec = GPUS[gpu]
    w = 1.0 / t  # relative error weights
    grid = np.linspace(0.05, 1.0, 96)
    a = np.stack([w, w * n, w * mixed], axis=1)
    best = None
    for fe in grid:
        tc = flops / (spec.peak_flops * fe)
        for be in grid:
            base = np.maximum(tc, nbytes / (spec.peak_bw * be))
            # (t - base) ~ o + s*n + m*mixed, weighted by 1/t
            coef, *_ = np.linalg.lstsq(a, (t - base) * w, rcond=None)
            o, s, m = (max(float(c), 0.0) for c in coef)
            rel = (base + o + s * n + m * mixed - t) / t
            score = float(np.mean(rel ** 2))
            if best is None or score < best[0]:
                best = (score, fe, be, o, s, m, rel)
    score, fe, be, o, s, m, rel = best
    return {"gpu": gpu, "model": model, "flops_eff": round(float(fe), 3),
            "bw_eff": round(float(be), 3), "step_overhead_s": float(o),
            "seq_overhead_s": float(s), "prefill_overhead_s": float(m), "n_steps": int(len(rows)),
            "median_abs_rel_err": float(np.median(np.abs(rel))),
            "p90_abs_rel_err": float(np.percentile(np.abs(rel), 90)), "_rel": rel}
