"""Step-time helpers several labs share: the named calibration what-ifs a ``steptime``
parameter may name, and one request's chunked prefill cost."""

from __future__ import annotations

from workbench.engines.sched.scheduler import attn_pairs
from workbench.engines.sim.steptime import H200_MINI_FIT, StepTimeModel
from workbench.errors import ConfigError
from workbench.hardware import STEP_PROFILES

# Step-time what-ifs. "kvcached-fit": slower steps (HBM at 55% of peak, 5 ms host overhead per
# step) chosen by hand so the static knee lands at PEAK 15 as in the published table; a fit to
# that table, not a measurement of vLLM.
CALIBRATIONS: dict[str, dict[str, float]] = {
    "roofline": {},
    "kvcached-fit": {"bw_eff": 0.55, "step_overhead_s": 0.005},
    # measured: the mini engine on an H200 (engines/steptime.py H200_MINI_FIT), a what-if here
    "mini-h200": dict(H200_MINI_FIT),
    # measured: real engines' steps fitted into named profiles (hardware.STEP_PROFILES)
    **{name: dict(p["fields"]) for name, p in STEP_PROFILES.items()},
}


def parse_steptime(text: str | None) -> dict[str, float]:
    """A name from :data:`CALIBRATIONS`, or ``key=value,...`` :class:`StepTimeModel` overrides."""
    if not text:
        return {}
    if "=" not in text:
        if text not in CALIBRATIONS:
            raise ConfigError(f"steptime {text!r}", "is not a known calibration",
                              f"use one of {', '.join(CALIBRATIONS)} or key=value pairs")
        return dict(CALIBRATIONS[text])
    out: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"steptime {part!r}", "is not key=number",
                              "write e.g. bw_eff=0.55,step_overhead_s=0.005") from None
    return out


def prefill_s(st: StepTimeModel, tokens: int, ctx: int = 0, budget: int = 2048) -> float:
    """One request prefilling ``tokens`` after ``ctx`` cached ones, in budget-sized chunks."""
    t = 0.0
    while tokens > 0:
        q = min(tokens, budget)
        t += st.cost(1, q, ctx, attn_pairs(q, ctx)).total_s
        ctx, tokens = ctx + q, tokens - q
    return t
