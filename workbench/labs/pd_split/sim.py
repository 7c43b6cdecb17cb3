"""PD-split lab (seed 003 E7): prefill/decode disaggregation against colocated serving at the same
GPU count, as the long-prompt share and the arrival rate rise.

Two measurements, one factor changed at a time:

* **single request at low load**: requests far apart (nothing queues), each 4096 tokens in and
  128 out; PD's TTFT split into prefill, link queue, transfer, decode wait and the decode tail;
* **goodput sweep**: a Poisson long/short mix (4096/128 long prompts at ``long_share``, the rest
  128/128 and 128/1024) at each rate, colocated and PD on the same seed; the mode order alternates
  between repeats (seed 003 §2); goodput under two SLOs, one loose on TPOT and one tight.

On ``host`` and ``gpu`` the lab runs the real handover instead (:mod:`~workbench.labs.
pd_split.real`): a prefill and a decode mini engine, the KV blocks copied between their pools,
against one colocated engine on the same requests (``gpus``, ``real_*`` parameters).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from workbench.engines.metrics import SLO
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError
from workbench.labs.kit.base import Progress
from workbench.labs.kit.serving import latency_row, mix
from workbench.pd.cluster import PDConfig, ServeResult, run_colocated, run_pd
from workbench.pd.link import LinkSpec
from workbench.pd.phases import phase_table

if TYPE_CHECKING:
    from workbench.labs.pd_split.params import PDSplitParams

MODES = ("colocated", "pd")
SLOS = {"interactive": SLO(1.0, 0.100), "streaming": SLO(2.0, 0.016)}


def config(p: PDSplitParams) -> PDConfig:
    if p.link_gbps <= 0:
        raise ConfigError(f"link_gbps={p.link_gbps}", "must be positive", "use e.g. 25")
    return PDConfig(prefill=p.prefill, decode=p.decode, gpu=p.gpu,
                    link=LinkSpec(p.link_gbps * 1e9, p.link_latency_us * 1e-6))


def serve(mode: str, cfg: PDConfig, reqs: list[Request]) -> ServeResult:
    return (run_pd if mode == "pd" else run_colocated)(cfg, reqs)


def single_requests(cfg: PDConfig, n: int = 6, gap_s: float = 3.0,
                    seed: int = 0) -> dict[str, Any]:
    """Low load: long prompts ``gap_s`` apart; each mode's TTFT and PD's TTFT phases (ms)."""
    import numpy as np

    out: dict[str, Any] = {}
    for mode in MODES:
        rng = np.random.default_rng(seed)
        reqs = [Request(i, rng.integers(1, 128_000, 4096).tolist(), 128, 0.1 + i * gap_s,
                        "long_in")
                for i in range(n)]
        res = serve(mode, cfg, reqs)
        out[mode] = latency_row(res.requests, SLOS["interactive"])["ttft_ms"]
        if mode == "pd":
            out["phases_ms"] = phase_table(res)
            out["link_s_expected_ms"] = round(cfg.link.transfer_s(
                res.handovers[0].nbytes) * 1e3, 3)
    out["extra_ms"] = round(out["pd"]["p50"] - out["colocated"]["p50"], 3)
    return out


def _row(mode: str, res: ServeResult) -> dict[str, Any]:
    rows = {k: latency_row(res.requests, slo) for k, slo in SLOS.items()}
    base = rows["interactive"]
    busy: dict[str, list[float]] = {}
    mixed: dict[str, int] = {}
    for u in res.instances:
        busy.setdefault(u.role, []).append(u.busy_s / res.sim_s if res.sim_s else 0.0)
        mixed[u.role] = mixed.get(u.role, 0) + u.mixed_steps
    return {"mode": mode, "ttft_ms": base["ttft_ms"], "tpot_ms": base["tpot_ms"],
            "itl_ms": base["itl_ms"], "e2e_ms": base["e2e_ms"], "finished": base["finished"],
            "output_tok_per_s": base["output_tok_per_s"], "steady_ratio": base["steady_ratio"],
            **{f"goodput_{k}": r["goodput_req_per_s"] for k, r in rows.items()},
            **{f"attain_{k}": r["slo_attainment"] for k, r in rows.items()},
            "busy": {k: round(sum(v) / len(v), 3) for k, v in busy.items()},
            "mixed_steps": mixed,
            "phases_ms": phase_table(res) if mode == "pd" else None,
            "wall_s": round(res.wall_s, 3)}


def sweep(p: PDSplitParams, progress: Progress | None = None) -> list[dict[str, Any]]:
    cfg = config(p)
    shares = (0.1, 0.5) if p.quick else tuple(sorted(p.long_shares))
    rates = (1.0, 4.0) if p.quick else tuple(sorted(p.rates))
    repeats = 1 if p.quick else max(1, p.repeats)
    n = min(p.num_requests, 150) if p.quick else p.num_requests
    runs: dict[tuple, list[dict]] = {}
    done, total = 0, len(shares) * len(rates) * len(MODES) * repeats
    for k in range(repeats):
        order = MODES if k % 2 == 0 else MODES[::-1]  # alternate the order (seed 003 §2)
        for share in shares:
            for rate in rates:
                for mode in order:
                    res = serve(mode, cfg, mix(rate, n, share, p.seed + k))
                    row = _row(mode, res)
                    row.update(seed=p.seed + k, position=order.index(mode))
                    runs.setdefault((share, rate, mode), []).append(row)
                    done += 1
                    if progress:
                        progress(done, total, f"share {share:g} {rate:g} req/s {mode}")
    return [{"long_share": s, "rate": r, **_pool(runs[(s, r, m)])}
            for s in shares for r in rates for m in MODES]


def _pool(per: list[dict]) -> dict[str, Any]:
    """The first repeat's distributions; goodputs averaged over repeats."""
    out = dict(per[0])
    for key in [k for k in out if k.startswith(("goodput_", "attain_"))]:
        out[key] = round(sum(r[key] for r in per) / len(per), 4)
    out["repeats"] = [{"seed": r["seed"], "position": r["position"],
                       "goodput_interactive": r["goodput_interactive"]} for r in per]
    return out


# The P:D ratio step (seed 003 E7 step 5): at a fixed GPU count, every split of prefill and
# decode instances against colocated serving on all of them, at one rate and two long-prompt
# shares; both sides' busy share shows which one saturates first.
SHARES = (0.1, 0.5)


def ratio_sweep(base: PDConfig, gpus: int, rate: float, n: int, seed: int) -> list[dict]:
    if gpus < 2:
        raise ConfigError(f"ratio_gpus={gpus}", "leaves no room for both sides",
                          "use at least 2 GPUs (0 skips the ratio step)")
    rows = []
    for share in SHARES:
        colo = run_colocated(replace(base, prefill=gpus - 1, decode=1), mix(rate, n, share, seed))
        rows.append({"long_share": share, "split": f"colocated x{gpus}", "prefill": 0,
                     **_row("colocated", colo)})
        for p in range(1, gpus):
            res = run_pd(replace(base, prefill=p, decode=gpus - p), mix(rate, n, share, seed))
            rows.append({"long_share": share, "split": f"{p}:{gpus - p}", "prefill": p,
                         **_row("pd", res)})
    return rows
