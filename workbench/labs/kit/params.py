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
from workbench.engines.real.vllm import VllmEngine
from workbench.engines.sim.steptime import GPUS
from workbench.errors import ConfigError
from workbench.labs.kit.resolve import EngineChoices
from workbench.labs.kit.steptime import CALIBRATIONS
from workbench.ranges import Choice, Flag, Floats, Num, Opt, Pairs, Spec

__all__ = ["specs", "check_value", "build", "check_params", "SEED", "QUICK", "REPEATS", "MODEL",
           "GPU", "ENGINE", "TOKENS", "RATE",
           "RATES", "REQUESTS", "SECONDS", "GBPS", "GIB", "STEPTIME", "RUNNER", "check_runner"]


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


def check_params(lab: str, params_type: type, params: Any) -> Any:
    """``params`` as lab ``lab``'s dataclass with every field checked, as the command line
    checks them: the lab's own dataclass (built by hand, so ``Lab.params`` was skipped), or a
    mapping of its parameter names; anything else -- another lab's parameters, a namespace,
    a number -- is refused in one line before anything runs."""
    if isinstance(params, Mapping):
        names = {f.name for f in dataclasses.fields(params_type)}
        bad = [k for k in params if not isinstance(k, str) or k not in names]
        if bad:
            raise ConfigError(f"parameter {str(bad[0])[:40]!r} of lab {lab!r}",
                              "is not one of its parameters",
                              f"use one of {', '.join(sorted(names))}")
        return build(lab, params_type, params)
    if type(params) is not params_type:
        shown = type(params).__name__
        raise ConfigError(f"lab {lab!r} params of type {shown}",
                          f"are not this lab's parameters ({params_type.__name__})",
                          f"build them with get_lab({lab!r}).params(key=value, ...)")
    typed = {f.name: check_value(lab, params_type, f.name, getattr(params, f.name))
             for f in dataclasses.fields(params)}
    return params_type(**typed)


def check_runner(lab: str, runner: str | None, run: Any) -> None:
    """``runner=`` picks a model runner of the run's server kinds: refused in one line, before
    anything starts, on a run that starts no server or on a kind without that runner."""
    if runner is None:
        return
    if run.family != "server" or not run.engines:
        raise ConfigError(f"lab {lab!r} parameter runner={runner} on backend {run.backend!r}",
                          "picks a real vLLM's model runner, and this run starts none",
                          "drop runner=, or use engine=vllm on host or gpu")
    for kind in run.engines:
        kind.server().runner_env(runner)


# Ranges several labs share. Upper bounds keep one run inside a small machine (a 2-core, 24 GiB
# host): thousands of requests, not millions; minutes of simulated traffic, not days.
SEED = Num(int, 0, 2**32 - 1)  # numpy's seed range
QUICK = Flag()
REPEATS = Opt(Num(int, 1, 20))  # None: the lab's own count
MODEL = Choice(tuple(MODELS))
GPU = Choice(tuple(GPUS))


# every lab's engine parameter: ENGINE(kinds or families it runs, preferred first)
ENGINE = EngineChoices
# vLLM's model runner (v1, v2) for a real vLLM; None: the one its environment picks
RUNNER = Opt(Choice(tuple(VllmEngine.runners)))
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


def _text(value: Any) -> str:
    """A default as the command line writes it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(_text(v) for v in value) or "(empty)"
    return str(value)


def _comments(params_type: type) -> dict[str, str]:
    """Each field's help: the comment after it in the dataclass's source (and the comment
    lines that carry it on)."""
    import inspect
    import re

    try:
        lines = inspect.getsource(params_type).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    last = None
    for line in lines:
        field = re.match(r"\s+(\w+):[^#]*?(?:#\s*(.*))?$", line)
        if field and not line.lstrip().startswith("#"):
            last = field.group(1) if field.group(2) else None
            if last:
                out[last] = field.group(2).strip()
        elif line.strip().startswith("#") and last:
            out[last] += " " + line.strip().lstrip("#").strip()
        else:
            last = None
    return out


def described(lab: Any) -> list[dict[str, str]]:
    """Every parameter of ``lab``: its name, default, declared range and help (what
    ``workbench labs params NAME`` prints)."""
    kind = lab.params_type
    helps, ranges, defaults = _comments(kind), specs(kind), kind()
    return [{"name": f.name, "default": _text(getattr(defaults, f.name)),
             "range": ranges[f.name].accepted() if f.name in ranges else "(undeclared)",
             "help": helps.get(f.name, "")}
            for f in dataclasses.fields(kind)]
