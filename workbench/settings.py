"""Every ``WORKBENCH_KV_*`` environment variable, parsed once into one typed :class:`Settings`.

Each reader in the workbench asks :func:`settings` instead of ``os.environ``, so a bad value is
refused the same way everywhere: one line naming the variable, the value and what is accepted.
Sizes are checked against the page granularity (2 MiB) here, at parse time, not when a pool is
built. An unknown ``WORKBENCH_KV_*`` name is a warning here (``workbench doctor --check`` makes
it an error): a misspelt knob is otherwise silently ignored.

The one reader that cannot come here is the autopatch ``.pth`` line: it runs at every interpreter
start and must import nothing from the workbench while ``WORKBENCH_KV_AUTOPATCH`` is unset.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from workbench.config import ENV_PREFIX, MiB, check_ipc_name, parse_size
from workbench.errors import ConfigError

GRANULE = 2 * MiB  # the page granularity every device has (CUDA VMM's minimum)
MAX_PAGE_SIZE = 1 << 30
MAX_LIMIT = 1 << 50
MAX_RESERVE = 4096
MAX_TOKENS = 1 << 40
_INT = re.compile(r"^\s*-?\d{1,20}\s*$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

# field -> what is accepted, the text every refusal of that field ends with
ACCEPTED: dict[str, str] = {
    "page_size": "a multiple of 2 MiB from 2 MiB to 1 GiB (e.g. 2MiB, 4MiB)",
    "memory_limit": "a multiple of 2 MiB from 2 MiB to 1 PiB (e.g. 512MiB, 8G)",
    "min_reserved_pages": f"an integer from 0 to {MAX_RESERVE}, at most max_reserved_pages",
    "max_reserved_pages": f"an integer from 0 to {MAX_RESERVE}, at least min_reserved_pages",
    "max_cached_tokens": f"-1 (unbounded), 0 (evict at once) or a count up to {MAX_TOKENS}",
    "gpu_utilization": "a number in (0, 1], e.g. 0.95",
    "contiguous_layout": "one of 1, 0, true, false, yes, no, on, off",
    "prealloc": "one of 1, 0, true, false, yes, no, on, off",
    "autopatch": "one of 1, 0, true, false, yes, no, on, off",
    "vllm_standalone": "one of 1, 0, true, false, yes, no, on, off",
    "vllm_blocks_per_page": "an integer from 1 to 1048576 that divides the page size",
    "vllm_budget": "a multiple of 2 MiB from 2 MiB to 1 PiB (e.g. 40GiB)",
    "gpu_budget": "0 (off) or a multiple of 2 MiB up to 1 PiB shared by every process on a GPU "
                  "(e.g. 80GiB)",
    "ipc_name": "1-64 characters of letters, digits, '_', '-' or '.'",
    "socket_dir": "an absolute directory path",
    "shm_dir": "an absolute directory path",
}


def _int_in(lo: int, hi: int):
    def check(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise ValueError("not an integer")
        if isinstance(raw, str):
            if not _INT.match(raw):
                raise ValueError("not an integer")
            raw = int(raw)
        if not lo <= raw <= hi:
            raise ValueError("out of range")
        return raw
    return BeforeValidator(check)


def _size(raw: Any, hi: int) -> int:
    try:
        value = parse_size(raw.strip() if isinstance(raw, str) else raw)
    except ConfigError as err:
        raise ValueError("out of range" if err.why.startswith("is larger") else "not a size") \
            from None
    if value < GRANULE or value > hi:
        raise ValueError("out of range")
    if value % GRANULE:
        raise ValueError("not a multiple of the 2 MiB page granularity")
    return value


def _budget_size(raw: Any) -> int:
    return 0 if isinstance(raw, (str, int)) and str(raw).strip() == "0" else _size(raw, MAX_LIMIT)


def _flag(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    low = raw.strip().lower() if isinstance(raw, str) else None
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise ValueError("not a yes/no value")


def _fraction(raw: Any) -> float:
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise ValueError("not a number") from None
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise ValueError("out of range")
    return value


def _ipc(raw: Any) -> str:
    try:
        return check_ipc_name(raw if isinstance(raw, str) else "")
    except ConfigError:
        raise ValueError("not a valid IPC name") from None


def _directory(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.startswith("/") or "\x00" in raw or len(raw) > 4096:
        raise ValueError("not an absolute path")
    return raw


Flag = Annotated[bool, BeforeValidator(_flag)]


class Settings(BaseSettings):
    """The process's ``WORKBENCH_KV_*`` configuration. Pool knobs mirror ``PoolConfig``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=True,
                                      extra="ignore", frozen=True, validate_default=False)

    page_size: Annotated[int, BeforeValidator(lambda v: _size(v, MAX_PAGE_SIZE))] = GRANULE
    memory_limit: Annotated[int | None, BeforeValidator(lambda v: _size(v, MAX_LIMIT))] = None
    min_reserved_pages: Annotated[int, _int_in(0, MAX_RESERVE)] = 5
    max_reserved_pages: Annotated[int, _int_in(0, MAX_RESERVE)] = 10
    max_cached_tokens: Annotated[int, _int_in(-1, MAX_TOKENS)] = -1
    gpu_utilization: Annotated[float, BeforeValidator(_fraction)] = 0.95
    contiguous_layout: Flag = True
    prealloc: Flag = True
    ipc_name: Annotated[str | None, BeforeValidator(_ipc)] = None
    autopatch: Flag = False
    vllm_standalone: Flag = False
    vllm_blocks_per_page: Annotated[int, _int_in(1, 1 << 20)] = 512
    vllm_budget: Annotated[int | None, BeforeValidator(lambda v: _size(v, MAX_LIMIT))] = None
    # one GPU's memory shared by every process on it (workbench.core.budget_segment); 0: off
    gpu_budget: Annotated[int, BeforeValidator(lambda v: _budget_size(v))] = 0
    socket_dir: Annotated[str | None, BeforeValidator(_directory)] = None
    shm_dir: Annotated[str, BeforeValidator(_directory)] = "/dev/shm"

    @model_validator(mode="after")
    def _reserve_order(self) -> Settings:
        if self.min_reserved_pages > self.max_reserved_pages:
            raise ValueError("min_reserved_pages exceeds max_reserved_pages")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   **_other: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # the environment reaches us through settings(), as init values: one path for
        # os.environ and for the mapping a test or a subprocess hands in
        return (init_settings,)


def var(field: str) -> str:
    return ENV_PREFIX + field.upper()


def known_names() -> frozenset[str]:
    return frozenset(var(f) for f in Settings.model_fields)


def unknown_names(env: Mapping[str, str] | None = None) -> list[str]:
    """``WORKBENCH_KV_*`` names in ``env`` that no setting reads (a typo, or a stale knob)."""
    env = os.environ if env is None else env
    known = known_names()
    return sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)


def settings(env: Mapping[str, str] | None = None, *, only: str | None = None) -> Settings:
    """The settings of ``env`` (``os.environ`` by default). Built once per distinct set of
    ``WORKBENCH_KV_*`` values; raises a one-line :class:`ConfigError` on the first bad value and
    warns once about each unknown ``WORKBENCH_KV_*`` name.

    ``only``: read just that field (the rest keep their defaults). For readers that run at import
    or interpreter start, where a bad unrelated knob must not stop the import: it is refused
    where it is used instead."""
    env = os.environ if env is None else env
    keep = (lambda k: k == var(only)) if only else (lambda k: k.startswith(ENV_PREFIX))
    return _build(tuple(sorted((k, v) for k, v in env.items() if keep(k))))


@lru_cache(maxsize=16)
def _build(ours: tuple[tuple[str, str], ...]) -> Settings:
    raw = dict(ours)
    values = {f: raw[var(f)] for f in Settings.model_fields if var(f) in raw}
    for name in unknown_names(raw):
        warnings.warn(f"{name} is not a workbench setting (ignored); known: "
                      f"{', '.join(sorted(known_names()))}", stacklevel=3)
    try:
        return Settings(**values)
    except ValidationError as err:
        raise _refusal(err, raw) from None


def _refusal(err: ValidationError, raw: Mapping[str, str]) -> ConfigError:
    first = err.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    if not field:  # the cross-field check: name what was set first, a default as such
        pair = [(var(f), Settings.model_fields[f].default)
                for f in ("min_reserved_pages", "max_reserved_pages")]
        pair.sort(key=lambda nd: nd[0] not in raw)
        shown = " with ".join(f"{n}={_shown(raw[n])}" if n in raw else f"{n} at its default {d}"
                              for n, d in pair)
        return ConfigError(shown, "the minimum reserve exceeds the maximum",
                           f"use min <= max, each an integer from 0 to {MAX_RESERVE}")
    why = str(first.get("ctx", {}).get("error", first["msg"]))
    return ConfigError(f"{var(field)}={_shown(raw.get(var(field)))}", why,
                       f"use {ACCEPTED[field]}")


def _shown(value: object, width: int = 40) -> str:
    """The value as the message quotes it: repr (control characters escaped), cut to a line."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 4] + "...'"
