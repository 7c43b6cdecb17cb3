"""A lab's declared parameter ranges: every field of a lab's parameter dataclass has a
:class:`~workbench.ranges.Spec` in the class's ``RANGES`` dict, and a value is checked against it
before the lab runs (typed through ``Lab.params``, as text through ``Lab.parse_params``, and once
more in ``run_lab`` for a dataclass built by hand), refused in one line naming the lab, the
parameter, the value and what is accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from workbench.engines.models import MODELS
from workbench.engines.sim.steptime import GPUS
from workbench.errors import ConfigError
from workbench.labs.kit.steptime import CALIBRATIONS
from workbench.ranges import Choice, Flag, Floats, Num, Opt, Pairs, Spec

__all__ = ["specs", "check_value", "build", "check_params", "SEED", "QUICK", "REPEATS", "MODEL",
           "GPU", "ENGINE", "VLLM_ONLY", "ENGINE_SGLANG", "VLLM_SGLANG", "TOKENS", "RATE",
           "RATES", "REQUESTS", "SECONDS", "GBPS", "GIB", "STEPTIME"]


def specs(params_type: type) -> dict[str, Spec]:
    """The declared spec of every field (a field without one is a bug the tests catch)."""
    return dict(getattr(params_type, "RANGES", {}))


def check_value(lab: str, params_type: type, key: str, value: Any) -> Any:
    """``value`` of parameter ``key``, typed, or a one-line :class:`ConfigError`."""
    spec = specs(params_type).get(key)
    if spec is None:
        raise ConfigError(f"parameter {key!r} of lab {lab!r}", "has no declared range",
                          f"declare it in {params_type.__name__}.RANGES")
    return spec.check(value, f"lab {lab!r} parameter {key}=")


def build(lab: str, params_type: type, values: Mapping[str, Any]) -> Any:
    """The dataclass from ``values`` (typed or text), each checked before it is built."""
    return params_type(**{k: check_value(lab, params_type, k, v) for k, v in values.items()})


def check_params(lab: str, params: Any) -> Any:
    """Every field of ``params`` checked (a dataclass built by hand skips ``Lab.params``); the
    same dataclass with typed values (a list becomes a tuple)."""
    kind = type(params)
    if not dataclasses.is_dataclass(params) or not specs(kind):
        return params
    typed = {f.name: check_value(lab, kind, f.name, getattr(params, f.name))
             for f in dataclasses.fields(params)}
    return kind(**typed)


# Ranges several labs share. Upper bounds keep one run inside a small machine (a 2-core, 24 GiB
# host): thousands of requests, not millions; minutes of simulated traffic, not days.
SEED = Num(int, 0, 2**32 - 1)  # numpy's seed range
QUICK = Flag()
REPEATS = Opt(Num(int, 1, 20))  # None: the lab's own count
MODEL = Choice(tuple(MODELS))
GPU = Choice(tuple(GPUS))
# a lab with a real-vLLM run: vllm, and the mini engine where the lab has a mini run
ENGINE = Choice(("vllm", "mini"))
VLLM_ONLY = Choice(("vllm",))  # on sim the simulated vLLM-like engine, elsewhere a real vLLM
# labs with a real-SGLang run too (engine=sglang: gpu only, SGLang's CUDA server)
ENGINE_SGLANG = Choice(("vllm", "sglang", "mini"))
VLLM_SGLANG = Choice(("vllm", "sglang"))
TOKENS = Num(int, 1, 32768, "tokens")  # one prompt or output, within the models' context
RATE = Num(float, 0.01, 1000.0, "req/s")
RATES = Floats(0.01, 1000.0, 16, "req/s")
REQUESTS = Num(int, 1, 20000, "requests")
# the long prompts' share of a long/short mix (kit/serving.mix): both kinds must be present
LONG_SHARE = Num(float, 0.01, 0.99)
LONG_SHARES = Floats(LONG_SHARE.lo, LONG_SHARE.hi)
SECONDS = Num(float, 0.1, 3600.0, "s")
GBPS = Num(float, 0.01, 10000.0, "GB/s")
GIB = Num(float, 0.01, 128.0, "GiB")  # gpu/host: real memory, at most one H200's
STEPTIME = Pairs(tuple(CALIBRATIONS), {
    "flops_eff": Num(float, 0.01, 1.0), "bw_eff": Num(float, 0.01, 1.0),
    "step_overhead_s": Num(float, 0.0, 1.0), "seq_overhead_s": Num(float, 0.0, 0.1),
    "prefill_overhead_s": Num(float, 0.0, 1.0), "prefill_gpu_frac": Num(float, 0.0, 1.0)})
