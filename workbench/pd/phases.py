"""Where a PD request's TTFT goes (pure): prefill queue, prefill, link queue, transfer, decode
admission wait and the decode side's tail step (seed 003 E7 step 3: decompose the extra cost)."""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.engines.sched.request import ReqState, Request

PHASES = ("prefill_queue", "prefill", "link_queue", "transfer", "decode_wait", "tail")


def phases(user: Request, prefill_copy: Request, sent: float, landed: float) -> dict[str, float]:
    """Seconds of each phase of one finished request; they add up to its TTFT."""
    p, d = prefill_copy, user
    return {"prefill_queue": p.first_scheduled - p.arrival,
            "prefill": p.finish - p.first_scheduled,
            "link_queue": sent - p.finish,
            "transfer": landed - sent,
            "decode_wait": d.first_scheduled - landed,
            "tail": d.first_token - d.first_scheduled}


def phase_table(result: Any) -> dict[str, float]:
    """Mean milliseconds of every phase over a PD run's finished requests (``ServeResult``)."""
    rows = [phases(r, result.prefill_copies[r.rid], result.handovers[r.rid].sent,
                   result.handovers[r.rid].landed)
            for r in result.requests if r.state is ReqState.FINISHED and r.preemptions == 0]
    if not rows:
        return {k: float("nan") for k in PHASES}
    return {k: round(float(np.mean([x[k] for x in rows])) * 1e3, 3) for k in PHASES}
