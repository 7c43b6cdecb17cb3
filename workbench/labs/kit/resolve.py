"""The resolved run: a lab's backend and engine kinds, resolved once, before anything runs.

:func:`resolve` asks the backend's :class:`~workbench.backends.Capabilities` and the engine-kind
registry (:mod:`workbench.engines.kinds`) what a lab's run will be -- which kinds, of which
family, on which device -- and refuses in one line what cannot run: an unknown backend, an
engine the lab does not run, a family or kind the backend cannot hold, a capability the lab's
runner needs, a device that cannot be built here, an engine that is not installed (unless the
run reads saved records back), fewer GPUs than the lab's ranks, a lab's own rule between its
parameters and the run (:meth:`~workbench.labs.kit.base.Lab.check_run`). The :class:`LabRun`
it returns is what the lab's runner gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.engines import kinds
from workbench.errors import ConfigError
from workbench.ranges import Choice

if TYPE_CHECKING:
    from workbench.backends import Capabilities
    from workbench.engines.kinds import EngineKind


@dataclass(frozen=True, slots=True)
class LabRun:
    """One lab run, resolved: where it runs and on which engine kinds."""

    lab: str
    backend: str
    caps: Capabilities
    family: str  # the runner that serves it (a key of the lab's runners)
    engines: tuple[EngineKind, ...] = ()  # () for a lab with no engine parameter

    @property
    def engine(self) -> EngineKind | None:
        """The run's (first) engine kind."""
        return self.engines[0] if self.engines else None

    @property
    def kind(self) -> str:
        """The run's engine kind names, ``+``-joined (what records and runners are given)."""
        return "+".join(k.name for k in self.engines)

    @property
    def device(self) -> str:
        """The torch device an engine on this backend computes on (``cpu``, ``cuda``)."""
        return self.caps.torch_device or "cpu"


class EngineChoices(Choice):
    """A lab's ``engine`` parameter: what it may name, in order of preference (the first one
    the backend can hold is the default) -- a kind, kinds side by side (``a+b``), or a family
    (every kind of it registered when asked) -- and the old spellings that mean one of them;
    its ``values`` are read from the registry when asked, so a kind registered later counts."""

    def __init__(self, *names: str):
        object.__setattr__(self, "names", names)

    @property
    def values(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.expand() + self.spellings()

    def expand(self) -> tuple[str, ...]:
        out: list[str] = []
        for n in self.names:
            out += kinds.of_family(n) if n in kinds.FAMILIES else [n]
        return tuple(dict.fromkeys(out))

    def spellings(self) -> tuple[str, ...]:
        """The old spellings that mean one of the choices on some backend."""
        names = self.expand()
        return tuple(dict.fromkeys(old for (old, _), new in kinds.OLD_SPELLINGS.items()
                                   if new in names and old not in names))

    def accepted(self) -> str:
        old = self.spellings()
        return "one of " + ", ".join(self.expand()) + (
            f" (old spellings: {', '.join(old)})" if old else "")

    def unlike(self) -> str:
        return "not an engine this lab runs"


def _refuse(lab: str, engine: Any, backend: str, why: str, fix: str) -> ConfigError:
    return ConfigError(f"lab {lab!r} parameter engine={engine} on backend {backend!r}", why, fix)


def _usable(names: tuple[str, ...], caps: Capabilities) -> list[str]:
    return [n for n in names
            if all(kinds.get(k).refusal(caps) is None for k in n.split("+"))]


def _fix(here: list[str], caps: Capabilities, elsewhere: tuple[str, ...]) -> str:
    """``use engine=a or engine=b here`` (each with its old spelling, where one maps to it
    here), and the backends where the named engine runs instead."""
    spelled = []
    for n in here:
        old = kinds.old_spelling(n, caps.simulated)
        spelled += [n] + ([old] if old else [])
    fix = f"use engine={' or engine='.join(spelled)} here" if spelled else ""
    if elsewhere:
        fix += (", or " if fix else "use ") + f"--backend {' or '.join(elsewhere)}"
    return fix or "use another --backend"


def _backends_for(name: str) -> tuple[str, ...]:
    from workbench.backends import REGISTRY, capabilities

    return tuple(b for b in REGISTRY if _usable((name,), capabilities(b)))


def _engines(lab: Any, choices: EngineChoices, value: Any, backend: str,
             caps: Capabilities) -> tuple[EngineKind, ...]:
    names = choices.expand()
    here = _usable(names, caps)
    if value is None:
        if not here:
            raise ConfigError(f"lab {lab.name!r} on backend {backend!r}",
                              "none of its engines runs there", _fix([], caps, lab.backends))
        return tuple(kinds.get(n) for n in here[0].split("+"))
    text = str(value)
    # an old spelling means what the table says on this backend, else the kind of that name
    candidates = list(dict.fromkeys((kinds.spelled(text, caps.simulated), text)))
    name = next((c for c in candidates if c in names), None)
    if name is None:
        real = next((c for c in candidates if c in kinds.REGISTRY), None)
        why = ("the lab has no run for that engine yet" if real is not None and
               kinds.get(real).refusal(caps) is None else
               f"is not an engine it runs ({', '.join(names)})")
        raise _refuse(lab.name, text, backend, why, _fix(here, caps, ()))
    chosen = tuple(kinds.get(n) for n in name.split("+"))
    for k in chosen:
        why = k.refusal(caps)
        if why is not None:
            raise _refuse(lab.name, text, backend, why,
                          _fix(here, caps, _backends_for(name) if here else lab.backends))
    return chosen


def _family(runners: Mapping[str, Any], caps: Capabilities, lab: str, backend: str) -> str:
    """The family of a lab with no engine parameter: the first of its runners the backend can
    hold."""
    for family in runners:
        if kinds.FAMILIES[family].runs_on(caps):
            return family
    raise ConfigError(f"lab {lab!r} on backend {backend!r}", "is not supported by this lab",
                      f"use --backend {' or '.join(backends_of(runners, None, {}))}")


def _needs(lab: str, backend: str, family: str, needs: Mapping[str, Mapping[str, Any]],
           caps: Capabilities) -> None:
    for field, want in needs.get(family, {}).items():
        if getattr(caps, field) != want:
            raise ConfigError(f"lab {lab!r} on backend {backend!r}",
                              f"its {family} run needs a backend with {field}={want}",
                              "use another --backend (see workbench labs list)")


def runs_on(runners: Mapping[str, Any], choices: EngineChoices | None,
            needs: Mapping[str, Mapping[str, Any]], caps: Capabilities) -> bool:
    """Whether some run of the lab fits a backend with ``caps``."""
    if choices is not None:
        families = {kinds.get(n.split("+")[0]).family for n in _usable(choices.expand(), caps)}
    else:
        families = {f for f in runners if kinds.FAMILIES[f].runs_on(caps)}
    return any(all(getattr(caps, k) == v for k, v in needs.get(f, {}).items())
               for f in families if f in runners)


def backends_of(runners: Mapping[str, Any], choices: EngineChoices | None,
                needs: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The backends (in the backend registry's order) some run of the lab fits."""
    from workbench.backends import REGISTRY, capabilities

    return tuple(n for n in REGISTRY if runs_on(runners, choices, needs, capabilities(n)))


def resolve(lab: Any, params: Any, backend: str) -> LabRun:
    """The run of ``lab`` with ``params`` on ``backend``, or the one-line refusal."""
    from workbench.backends import capabilities, require

    caps = capabilities(backend)  # an unknown name is refused here
    choices = lab.engine_choices()
    if choices is None:
        family, engines = _family(lab.runners, caps, lab.name, backend), ()
    else:
        engines = _engines(lab, choices, getattr(params, "engine", None), backend, caps)
        family = engines[0].family
    if family not in lab.runners or not runs_on(lab.runners, choices, lab.needs, caps):
        raise ConfigError(f"lab {lab.name!r} on backend {backend!r}",
                          "is not supported by this lab",
                          f"use --backend {' or '.join(lab.backends)}")
    _needs(lab.name, backend, family, lab.needs, caps)
    require(backend)
    reading = lab.reads_back is not None and getattr(params, lab.reads_back, None)
    for k in () if reading else engines:  # records read back start no engine
        k.require(f"lab {lab.name!r} with engine={k.name}")
    if lab.ranks is not None:
        from workbench.labs.kit.tp_pp_workers import need_gpus

        p = params if params is not None else lab.params()
        need_gpus(lab.name, backend, lab.ranks(p), getattr(p, "gpus", None))
    run = LabRun(lab.name, backend, caps, family, engines)
    lab.check_run(params if params is not None else lab.params(), run)
    return run
