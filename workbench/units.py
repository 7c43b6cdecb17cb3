"""Byte units and integer rounding, one copy for the whole package.

Sizes are binary (a GPU's "141 GB" H200 is 141 GiB here, as ``cuMemGetInfo`` counts it); the
rounding helpers are exact on integers (no float detour), so page and block counts never drift.
"""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers (``b > 0``): how many ``b``-sized pieces cover ``a``."""
    return -(-a // b)


def align_up(x: int, m: int) -> int:
    """The smallest multiple of ``m`` that is ``>= x``."""
    return -(-x // m) * m


def align_down(x: int, m: int) -> int:
    """The largest multiple of ``m`` that is ``<= x``."""
    return x // m * m


__all__ = ["GiB", "KiB", "MiB", "TiB", "align_down", "align_up", "ceil_div"]
