"""Every configuration knob defined once: its type, range, default and refusal text.

Three readers go through this table and nothing else: the environment (``WORKBENCH_KV_<NAME>``,
text, :mod:`workbench.settings`), ``PoolConfig(...)`` in code and a trace's ``pool`` line (typed
values). So one bad value is refused with the same ``why. Fix: ...`` wherever it comes from; only
the ``what`` (which variable, field or trace line) differs. Text is strict: ASCII digits only,
finite numbers inside the range, absolute paths. A typed value is strict too: a count is an
``int`` (``2.0`` and ``True`` are not), a flag a ``bool``, a size an ``int`` or a size string.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from workbench.errors import ConfigError
from workbench.names import NAME_CHARS, NAME_MAX, name_problem
from workbench.units import GiB, MiB, PiB, parse_size

GRANULE = 2 * MiB  # the page granularity every device has (CUDA VMM's minimum)
MAX_RESERVE = 4096
MAX_TOKENS = 1 << 40
MAX_PATH = 4096
SIZE, COUNT, FRACTION, FLAG, NAME, PATH = "size", "count", "fraction", "flag", "name", "path"
_INT = re.compile(r"-?[0-9]{1,4000}", re.ASCII)  # under int()'s 4300-digit limit
_FLOAT = re.compile(r"-?(?:[0-9]{1,400}(?:\.[0-9]{0,400})?|\.[0-9]{1,400})(?:[eE][-+]?[0-9]{1,4})?"
                    r"|nan|[-+]?inf(?:inity)?", re.ASCII | re.IGNORECASE)
_BLANKS = " \t"  # the only blanks a value may carry around it (str.strip takes any Unicode one)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_YES_NO = "one of 1, 0, true, false, yes, no, on, off"


class Refused(ValueError):
    """A knob's value is refused; ``str()`` is the why (what is accepted is the knob's)."""


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # the field name; the variable is WORKBENCH_KV_<NAME>
    kind: str  # SIZE, COUNT, FRACTION, FLAG, NAME or PATH
    default: Any
    accepted: str  # the text every refusal of this knob ends with: "Fix: use <accepted>"
    lo: int | float = 0
    hi: int | float = 0
    granule: int = 1
    unset_ok: bool = False  # None is a value (the knob is unset)
    pool: bool = False  # a PoolConfig field
    existing: bool = False  # PATH: must be an existing directory

    def parse(self, text: str) -> Any:
        """The value of the environment's text, or :class:`Refused`."""
        if not isinstance(text, str):
            raise Refused("not text")
        raw = text.strip(_BLANKS)
        if self.kind == COUNT:
            if not _INT.fullmatch(raw):
                raise Refused("not an integer")
            return self.check(int(raw))
        if self.kind == FRACTION:
            if not _FLOAT.fullmatch(raw):
                raise Refused("not a number")
            return self.check(float(raw))
        if self.kind == FLAG:
            low = raw.lower()
            if low not in _TRUE and low not in _FALSE:
                raise Refused("not a yes/no value")
            return low in _TRUE
        return self.check(text)  # sizes, names and paths read text as their typed value does

    def check(self, value: Any) -> Any:
        """The typed value (from code or a trace), normalised, or :class:`Refused`."""
        if value is None and self.unset_ok:
            return None
        return _CHECKS[self.kind](self, value)

    def refusal(self, what: str, why: str) -> ConfigError:
        return ConfigError(what, why, f"use {self.accepted}")


def _size(k: Knob, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)) or \
            isinstance(v, str) and len(v) > 60:
        raise Refused("not a size")
    try:
        n = parse_size(v)
    except ConfigError as err:
        raise Refused("out of range" if err.why.startswith(("is larger", "is negative"))
                      else "not a size") from None
    if not k.lo <= n <= k.hi:
        raise Refused("out of range")
    if n % k.granule:
        raise Refused(f"not a multiple of the {k.granule // MiB} MiB page granularity")
    return n


def _count(k: Knob, v: Any) -> int:
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise Refused("not an integer")
    n = int(v.__index__())
    if not k.lo <= n <= k.hi:
        raise Refused("out of range")
    return n


def _fraction(k: Knob, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Refused("not a number")
    x = float(v)
    if not math.isfinite(x) or not k.lo <= x <= k.hi:  # a denormal is below lo, too
        raise Refused("out of range")
    return x


def _flag(k: Knob, v: Any) -> bool:
    if not isinstance(v, bool):
        raise Refused("not a yes/no value")
    return v


def _name(k: Knob, v: Any) -> str:
    if name_problem(v) is not None:
        raise Refused("not a valid IPC name")
    return v


def _path(k: Knob, v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/") or len(v) > MAX_PATH \
            or not v.isprintable():
        raise Refused("not an absolute path")
    if k.existing and not os.path.isdir(v):
        raise Refused("not an existing directory" if not os.path.exists(v) else
                      "not a directory")
    return v


_CHECKS = {SIZE: _size, COUNT: _count, FRACTION: _fraction, FLAG: _flag, NAME: _name,
           PATH: _path}


def _sized(name: str, default: int | None, hi: int, example: str, *, pool: bool) -> Knob:
    top = "1 GiB" if hi == GiB else "1 PiB"
    return Knob(name, SIZE, default, f"a multiple of 2 MiB from 2 MiB to {top} (e.g. {example})",
                lo=GRANULE, hi=hi, granule=GRANULE, unset_ok=default is None, pool=pool)


def _flagged(name: str, default: bool, *, pool: bool = False) -> Knob:
    return Knob(name, FLAG, default, _YES_NO, pool=pool)


KNOBS: dict[str, Knob] = {k.name: k for k in (
    _sized("page_size", GRANULE, GiB, "2MiB, 4MiB", pool=True),
    _sized("memory_limit", None, PiB, "512MiB, 8G", pool=True),
    Knob("min_reserved_pages", COUNT, 5, f"an integer from 0 to {MAX_RESERVE}, at most "
         "max_reserved_pages", hi=MAX_RESERVE, pool=True),
    Knob("max_reserved_pages", COUNT, 10, f"an integer from 0 to {MAX_RESERVE}, at least "
         "min_reserved_pages", hi=MAX_RESERVE, pool=True),
    Knob("max_cached_tokens", COUNT, -1, "-1 (unbounded), 0 (evict at once) or a count up to "
         f"{MAX_TOKENS}", lo=-1, hi=MAX_TOKENS, pool=True),
    Knob("gpu_utilization", FRACTION, 0.95, "a number from 0.01 to 1, e.g. 0.95", lo=0.01,
         hi=1.0, pool=True),
    _flagged("contiguous_layout", True, pool=True),
    _flagged("prealloc", True, pool=True),
    Knob("ipc_name", NAME, None, f"1-{NAME_MAX} characters of {NAME_CHARS}", unset_ok=True,
         pool=True),
    _flagged("autopatch", False),
    _flagged("vllm_standalone", False),
    _flagged("vllm_own_order", False),
    Knob("vllm_blocks_per_page", COUNT, 512, "an integer from 1 to 1048576 that divides the page "
         "size", lo=1, hi=1 << 20),
    _sized("vllm_budget", None, PiB, "40GiB", pool=False),
    Knob("gpu_budget", SIZE, 0, "0 (off) or a multiple of 2 MiB up to 1 PiB shared by every "
         "process on a GPU (e.g. 80GiB)", hi=PiB, granule=GRANULE),
    Knob("socket_dir", PATH, None, "an absolute directory path", unset_ok=True),
    Knob("shm_dir", PATH, "/dev/shm", "an absolute directory path",
         existing=True),
    # an engine process appends one JSON line per scheduler step here (observes, changes nothing)
    Knob("step_log", PATH, None, "an absolute file path (e.g. /tmp/run/steps-0.jsonl)",
         unset_ok=True),
)}
POOL_KNOBS = tuple(k for k in KNOBS.values() if k.pool)
RESERVE_FIX = f"use min <= max, each an integer from 0 to {MAX_RESERVE}"
RESERVE_WHY = "the minimum reserve exceeds the maximum"


def default(name: str) -> Any:
    return KNOBS[name].default


def shown(value: object, width: int = 40) -> str:
    """A value as a refusal quotes it: repr (control characters escaped), cut to a line."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 4] + "...'"


def check(name: str, value: Any, what: str | None = None) -> Any:
    """``value`` for knob ``name`` (typed, from code or a trace), or a one-line ConfigError;
    ``what`` names where it came from (default ``name=value``)."""
    knob = KNOBS[name]
    try:
        return knob.check(value)
    except Refused as why:
        raise knob.refusal(what or f"{name}={shown(value)}", str(why)) from None


def check_reserve(low: int, high: int, what: str) -> None:
    """The one cross-knob rule: ``min_reserved_pages <= max_reserved_pages``."""
    if low > high:
        raise ConfigError(what, RESERVE_WHY, RESERVE_FIX)
