"""Byte units and integer rounding, one copy for the whole package.

Sizes are binary (a GPU's "141 GB" H200 is 141 GiB here, as ``cuMemGetInfo`` counts it); the
rounding helpers are exact on integers (no float detour), so page and block counts never drift.
"""

from __future__ import annotations

import re

from workbench.errors import ConfigError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
PiB = 1 << 50
MAX_SIZE = (1 << 62) - 1  # control segments store sizes as int64: leave headroom for sums

# ASCII digits and blanks only: Python's \d and int() also take Arabic-Indic or full-width digits
_SIZE = re.compile(r"[ \t]*(-?[0-9]{1,40})(?:\.([0-9]{1,9}))?[ \t]*([kmgt]?)(i?b?)[ \t]*",
                   re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}
_NOT_A_SIZE = "write a number with an optional unit: 4096, 512MiB, 8G"


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``): how many ``b``-sized pieces cover ``a``."""
    return -(-a // b)


def align_up(x: int, m: int) -> int:
    """The smallest multiple of ``m`` that is ``>= x``."""
    return -(-x // m) * m


def align_down(x: int, m: int) -> int:
    """The largest multiple of ``m`` that is ``<= x``."""
    return x // m * m


def parse_size(text: str | int) -> int:
    """``8G``, ``512MiB``, ``1.5g``, ``4096`` -> bytes (binary units); a ConfigError otherwise.

    Exact integer arithmetic (no float), so a huge number is refused as too large rather than
    overflowing; a fraction of a byte rounds down; a bool is not a size."""
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise ConfigError(f"size {text!r}", "not a size", _NOT_A_SIZE)
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.fullmatch(text)
        if not m:
            raise ConfigError(f"size {text!r}", "not a size", _NOT_A_SIZE)
        whole, frac, unit = m.group(1), m.group(2) or "", _UNITS[m.group(3).lower()]
        value = int(whole + frac) * unit
        value = -(-value // 10 ** len(frac)) if value < 0 else value // 10 ** len(frac)
    if value < 0:
        raise ConfigError(f"size {text!r}", "is negative", "use a size of 0 or more")
    if value > MAX_SIZE:
        raise ConfigError(f"size {text!r}", f"is larger than {MAX_SIZE} bytes",
                          "use a size below 4 EiB")
    return value


def format_size(n: int) -> str:
    """Bytes as a short human size (two decimals: for display, never parsed back)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


__all__ = ["MAX_SIZE", "GiB", "KiB", "MiB", "PiB", "TiB", "align_down", "align_up", "ceil_div",
           "format_size", "parse_size"]
