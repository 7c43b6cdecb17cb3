"""The one registry of engine kinds: every engine a lab can run, by a name that means the same
on every backend.

==============  ==========  =====================================================================
name            family      what it is
==============  ==========  =====================================================================
``sim-vllm``    simulated   the vLLM-like scheduler on simulated time and memory (``sim``)
``sim-sglang``  simulated   the SGLang-like scheduler (radix cache) on simulated time and memory
``mini``        mini        the workbench's own engine: a real model over a real pool, in process
``vllm``        server      a real vLLM, its OpenAI server in a process of its own
``sglang``      server      a real SGLang server in a process of its own (CUDA only)
==============  ==========  =====================================================================

A family says where its kinds run (:data:`FAMILIES`); a kind says what it needs (CUDA), its
scheduler style, the versions it supports and its title, and -- for a server kind -- names the
:class:`~workbench.engines.real.server.ServerEngine` class that owns its behaviour (interpreter,
model folder, start, counters, blocks per page, spec defaults), imported on first use.

The spellings the labs took before (``engine=vllm`` meaning the simulated scheduler on ``sim``
and a real vLLM elsewhere; cross-engine's ``sim``/``real``) keep working through one table,
:data:`OLD_SPELLINGS`, where the backend makes them unambiguous. A ``+`` joins kinds that run
side by side (cross-engine's pair).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.errors import ConfigError

if TYPE_CHECKING:
    from workbench.backends import Capabilities
    from workbench.engines.real.server import ServerEngine


@dataclass(frozen=True, slots=True)
class Family:
    """Where a family's kinds run, asked of the backend's capabilities."""

    name: str
    title: str
    runs_on: Callable[[Capabilities], bool]
    where: str  # the backends it needs, in words (for refusals)


FAMILIES: dict[str, Family] = {
    "simulated": Family("simulated", "simulated time and memory", lambda c: c.simulated,
                        "a simulated backend (--backend sim)"),
    "mini": Family("mini", "the workbench's own code on real memory, in process",
                   lambda c: not c.simulated, "a real backend (--backend host or gpu)"),
    "server": Family("server", "a real engine's server in a process of its own",
                     lambda c: not c.simulated and c.real_processes,
                     "a real backend (--backend host or gpu)"),
}


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One engine kind: what it is and what it needs."""

    name: str
    family: str  # a key of FAMILIES
    title: str
    scheduler: str  # the scheduling style: "vllm" (paged blocks) or "sglang" (radix cache)
    product: str = ""  # the engine's own name in messages ("SGLang")
    cuda_only: bool = False
    versions: tuple[str, ...] = ()  # the engine releases the workbench supports
    engine: str = ""  # "module:Class" of a server kind's ServerEngine

    def server(self) -> type[ServerEngine]:
        """The class that starts and reads this server kind (imported now)."""
        if not self.engine:
            raise ConfigError(f"engine kind {self.name!r}", "is not a server kind",
                              "use a kind of the server family")
        module, _, cls = self.engine.partition(":")
        return getattr(importlib.import_module(module), cls)

    def refusal(self, caps: Capabilities) -> str | None:
        """Why this kind cannot run on a backend with ``caps`` (None: it can)."""
        family = FAMILIES[self.family]
        if self.cuda_only and not caps.cuda:
            return f"the {self.name} kind runs {self.product}'s CUDA server only"
        if not family.runs_on(caps):
            return (f"is not an engine it runs on this backend (the {self.name} kind, "
                    f"{family.title}, needs {family.where})")
        return None

    def missing(self) -> str | None:
        """None when this kind's engine is there to start (a server kind: its interpreter),
        else the one-line reason and how to get it."""
        return self.server().missing() if self.engine else None

    def require(self, what: str) -> str | None:
        """A server kind's interpreter, or a one-line refusal naming ``what`` needed it; None
        for a kind that runs in this process."""
        return self.server().require(what) if self.engine else None


REGISTRY: dict[str, EngineKind] = {
    "sim-vllm": EngineKind("sim-vllm", "simulated", "simulated vLLM-like engine", "vllm"),
    "sim-sglang": EngineKind("sim-sglang", "simulated", "simulated SGLang-like engine",
                             "sglang"),
    "mini": EngineKind("mini", "mini", "mini engine (a real model over a real pool)", "vllm"),
    "vllm": EngineKind("vllm", "server", "real vLLM", "vllm", "vLLM", versions=("0.26", "0.32"),
                       engine="workbench.engines.real.vllm:VllmEngine"),
    "sglang": EngineKind("sglang", "server", "real SGLang", "sglang", "SGLang", cuda_only=True,
                         versions=("0.5.16",),
                         engine="workbench.engines.real.sglang:SglangEngine"),
}

# (what a user typed before, the backend is simulated) -> the kind(s) it names
OLD_SPELLINGS: dict[tuple[str, bool], str] = {
    ("vllm", True): "sim-vllm",
    ("sglang", True): "sim-sglang",
    ("sim", True): "sim-vllm+sim-sglang",
    ("sim", False): "sim-vllm+sim-sglang",
    ("real", True): "vllm+sglang",
    ("real", False): "vllm+sglang",
}


def spelled(text: str, simulated: bool) -> str:
    """The kind name(s) ``text`` means on a backend that is (not) simulated: itself, or what
    the old-spelling table maps it to."""
    return OLD_SPELLINGS.get((text, simulated), text)


def old_spelling(name: str, simulated: bool) -> str | None:
    """The old spelling that means ``name`` on such a backend, if there is one."""
    return next((old for (old, sim), new in OLD_SPELLINGS.items()
                 if new == name and sim == simulated), None)


def get(name: str) -> EngineKind:
    """The kind named ``name``; an unknown one is refused in one line."""
    if name not in REGISTRY:
        raise ConfigError(f"engine kind {name!r}", "is not an engine kind",
                          f"use one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def parse(text: str, simulated: bool) -> tuple[EngineKind, ...]:
    """The kinds ``text`` names (``+`` joins kinds side by side), old spellings mapped."""
    return tuple(get(n) for n in spelled(text, simulated).split("+"))


def of_family(family: str) -> tuple[str, ...]:
    """The registered kinds of ``family``, in registry order."""
    return tuple(n for n, k in REGISTRY.items() if k.family == family)


def register(kind: EngineKind) -> EngineKind:
    """Add ``kind`` to the registry (an extension, or a stand-in in tests)."""
    if kind.family not in FAMILIES:
        raise ConfigError(f"engine kind {kind.name!r} of family {kind.family!r}",
                          "is not a family", f"use one of {', '.join(FAMILIES)}")
    REGISTRY[kind.name] = kind
    return kind
