"""Every ``WORKBENCH_KV_*`` environment variable, read once into one typed :class:`Settings`.

Each reader in the workbench asks :func:`settings` instead of ``os.environ``, and each variable is
a knob of :mod:`workbench.knobs` (its type, range, default and refusal text are there), so a bad
value is refused the same way everywhere: one line naming the variable, the value and what is
accepted. The ``workbench`` command reads the settings before any command runs (``doctor``
reports them instead), so ``serve``, ``replay``, ``kvctl`` and the rest refuse alike, exit 2.

An unknown ``WORKBENCH_KV_*`` name is refused too: ``WORKBENCH_KV_MEMORY_LIMT=1G`` is a limit
the operator believes in force, and a warning scrolls past at a server's start. ``doctor`` lists
such names instead of refusing them (``doctor --check`` fails on them).

The one reader that cannot come here is the autopatch ``.pth`` line: it runs at every interpreter
start and must import nothing from the workbench while ``WORKBENCH_KV_AUTOPATCH`` is unset.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from workbench.errors import ConfigError
from workbench.knobs import GRANULE, KNOBS, Refused, check_reserve, default, shown
from workbench.terminal import plain

ENV_PREFIX = "WORKBENCH_KV_"

__all__ = ["ENV_PREFIX", "GRANULE", "Settings", "known_names", "settings", "unknown_names", "var"]


@dataclass(frozen=True, slots=True)
class Settings:
    """The process's ``WORKBENCH_KV_*`` configuration; ``given``: the fields the environment set
    (the rest are the knobs' defaults). Pool knobs mirror ``PoolConfig``."""

    page_size: int = default("page_size")
    memory_limit: int | None = default("memory_limit")
    min_reserved_pages: int = default("min_reserved_pages")
    max_reserved_pages: int = default("max_reserved_pages")
    max_cached_tokens: int = default("max_cached_tokens")
    gpu_utilization: float = default("gpu_utilization")
    contiguous_layout: bool = default("contiguous_layout")
    prealloc: bool = default("prealloc")
    ipc_name: str | None = default("ipc_name")
    autopatch: bool = default("autopatch")
    vllm_standalone: bool = default("vllm_standalone")
    vllm_own_order: bool = default("vllm_own_order")  # vLLM's block order even where it maps
    vllm_blocks_per_page: int = default("vllm_blocks_per_page")
    vllm_budget: int | None = default("vllm_budget")
    gpu_budget: int = default("gpu_budget")  # one GPU's memory every process shares; 0: off
    socket_dir: str | None = default("socket_dir")
    shm_dir: str = default("shm_dir")
    step_log: str | None = default("step_log")  # engines append one JSON line per step there
    given: frozenset[str] = field(default=frozenset(), compare=False)


def var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def known_names() -> frozenset[str]:
    return frozenset(var(k) for k in KNOBS)


def unknown_names(env: Mapping[str, str] | None = None) -> list[str]:
    """``WORKBENCH_KV_*`` names in ``env`` that no setting reads (a typo, or a stale knob)."""
    env = os.environ if env is None else env
    known = known_names()
    return sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)


def settings(env: Mapping[str, str] | None = None, *, only: str | None = None) -> Settings:
    """The settings of ``env`` (``os.environ`` by default), built once per distinct set of
    ``WORKBENCH_KV_*`` values; a one-line :class:`ConfigError` on an unknown name or the first
    bad value (in the knob table's order).

    ``only``: read just that knob (the rest keep their defaults, unknown names are not looked
    at). For readers that run at import or interpreter start, where a bad unrelated knob must not
    stop the import: it is refused where the settings are read whole instead."""
    env = os.environ if env is None else env
    keep = (lambda k: k == var(only)) if only else (lambda k: k.startswith(ENV_PREFIX))
    return _build(tuple(sorted((k, v) for k, v in env.items() if keep(k))))


@lru_cache(maxsize=16)
def _build(ours: tuple[tuple[str, str], ...]) -> Settings:
    raw = dict(ours)
    for name in unknown_names(raw):
        raise _unknown(name, raw[name])
    values = {}
    for knob in KNOBS.values():
        if var(knob.name) in raw:
            text = raw[var(knob.name)]
            try:
                values[knob.name] = knob.parse(text)
            except Refused as why:
                raise knob.refusal(f"{var(knob.name)}={shown(text)}", str(why)) from None
    s = Settings(**values, given=frozenset(values))
    check_reserve(s.min_reserved_pages, s.max_reserved_pages, _reserve_what(raw))
    return s


def _unknown(name: str, value: str) -> ConfigError:
    near = difflib.get_close_matches(name, sorted(known_names()), n=1, cutoff=0.8)
    fix = f"did you mean {near[0]}? Else unset it" if near else \
        "unset it (docs/adapters.md lists every setting)"
    return ConfigError(f"{plain(name)}={shown(value)}", "not a workbench setting", fix)


def _reserve_what(raw: Mapping[str, str]) -> str:
    """Both reserve knobs, what was set first, a default named as such."""
    pair = [(var(f), default(f)) for f in ("min_reserved_pages", "max_reserved_pages")]
    pair.sort(key=lambda nd: nd[0] not in raw)
    return " with ".join(f"{n}={shown(raw[n])}" if n in raw else f"{n} at its default {d}"
                         for n, d in pair)
