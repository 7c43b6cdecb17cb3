"""How the bandwidth probe backs ``regions`` KV regions with physical memory: pure plans, no GPU.

A plan is the list of physical handles in creation order, each with the mappings made from it
right after its creation: ``(va offset, size, offset into the handle)``. Variants:

* ``h2m_page``: one 2 MiB handle per piece, page id by page id (page 0 of every region, then
  page 1 ...): what a PER_LAYER pool does as it grows.
* ``h2m_region``: the same handles, created region by region (each region's pieces in a row).
* ``h2m_rev``: the same handles region by region, each region's pieces from its end backwards.
* ``h2m_shuf``: the same handles in a shuffled order (a pool after much grow/shrink churn).
* ``hbatch<k>``: the same handles, ``k`` page ids at a time, region by region within the batch
  (a pool that grows ``k`` page ids per driver batch).
* ``hchunk<k>``: one ``k * 2 MiB`` handle per region and page id, page id by page id: what a
  PER_LAYER pool does with ``page_size = k * 2 MiB`` (``pages`` must be a multiple of ``k``).
* ``hpage``: one handle per page id (``regions`` pieces), each region's piece of that page id
  mapped from it at ``region * piece`` (``cuMemMap``'s offset): one create per page id.
* ``hregion``: one handle per region, mapped in one call.
* ``hregion_2m``: one handle per region, mapped in 2 MiB pieces (physically contiguous, but
  with the mapping granularity of ``h2m_*``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from random import Random

from workbench.errors import ConfigError

PIECE = 2 << 20
VARIANTS = ("h2m_page", "h2m_region", "h2m_rev", "h2m_shuf", "hbatch4", "hbatch8", "hchunk4",
            "hchunk8", "hpage", "hregion", "hregion_2m")


@dataclass(slots=True)
class Handle:
    """One ``cuMemCreate`` of ``size`` bytes and its mappings ``(va_off, size, handle_off)``;
    ``page``: the page id whose growth creates it (None where no page id does)."""

    size: int
    maps: list[tuple[int, int, int]] = field(default_factory=list)
    page: int | None = None


def plan(variant: str, regions: int, pages: int, piece: int = PIECE) -> list[Handle]:
    """The handles backing ``regions`` regions of ``pages`` pieces each, region ``i`` at
    ``i * pages * piece`` of one reservation, in creation order."""
    if regions <= 0 or pages <= 0 or piece <= 0:
        raise ConfigError(f"plan({regions} regions, {pages} pages, piece {piece})",
                          "every count and size must be positive", "pass positive sizes")
    region = pages * piece

    def va(i: int, p: int) -> int:
        return i * region + p * piece

    if variant == "h2m_page":
        return [Handle(piece, [(va(i, p), piece, 0)], p)
                for p in range(pages) for i in range(regions)]
    if variant == "h2m_region":
        return [Handle(piece, [(va(i, p), piece, 0)]) for i in range(regions)
                for p in range(pages)]
    if variant == "h2m_rev":
        return [Handle(piece, [(va(i, p), piece, 0)]) for i in range(regions)
                for p in reversed(range(pages))]
    if variant == "h2m_shuf":
        hs = [Handle(piece, [(va(i, p), piece, 0)]) for i in range(regions) for p in range(pages)]
        Random(15).shuffle(hs)
        return hs
    k = int(variant[6:]) if variant[:6] in ("hbatch", "hchunk") and variant[6:].isdigit() else 0
    if variant.startswith("hbatch") and k > 0:
        return [Handle(piece, [(va(i, p), piece, 0)], p) for b in range(0, pages, k)
                for i in range(regions) for p in range(b, min(b + k, pages))]
    if variant.startswith("hchunk") and k > 0:
        if pages % k:
            raise ConfigError(f"{variant} over {pages} pages", f"pages must be a multiple of {k}",
                              f"pass a multiple of {k} pieces per region")
        return plan("h2m_page", regions, pages // k, piece * k)
    if variant == "hpage":
        return [Handle(regions * piece, [(va(i, p), piece, i * piece) for i in range(regions)], p)
                for p in range(pages)]
    if variant == "hregion":
        return [Handle(region, [(va(i, 0), region, 0)]) for i in range(regions)]
    if variant == "hregion_2m":
        return [Handle(region, [(va(i, p), piece, p * piece) for p in range(pages)])
                for i in range(regions)]
    raise ConfigError(f"variant {variant!r}", "the probe knows no such backing",
                      f"use one of {', '.join(VARIANTS)}")


def check_plan(handles: list[Handle], total: int) -> None:
    """Refuse a plan whose mappings do not cover ``[0, total)`` exactly once, or that maps
    outside a handle or one handle byte twice."""
    spans = sorted((v, v + s) for h in handles for v, s, _ in h.maps)
    end = 0
    for lo, hi in spans:
        if lo != end:
            raise ConfigError(f"plan mapping at {lo}", f"expected the next one at {end}",
                              "map every byte of the regions exactly once")
        end = hi
    if end != total:
        raise ConfigError("plan", f"covers {end} of {total} bytes", "map the whole range")
    for n, h in enumerate(handles):
        used = sorted((o, o + s) for _, s, o in h.maps)
        if not used or any(a[1] > b[0] for a, b in pairwise(used)) or used[-1][1] > h.size:
            raise ConfigError(f"plan handle {n}", "maps nothing, a byte twice or past its size",
                              "map disjoint parts of each handle")


def per_page(times: list[float], handles: list[Handle]) -> list[float]:
    """Per page id, the summed ``times`` (one per handle, same order) of the handles it creates."""
    out: dict[int, float] = {}
    for t, h in zip(times, handles, strict=True):
        if h.page is not None:
            out[h.page] = out.get(h.page, 0.0) + t
    return [out[p] for p in sorted(out)]


def rotation(names: list[str], r: int) -> list[str]:
    """Repeat ``r``'s subject order: rotated by ``r // 2``, and reversed on odd repeats, so each
    pair of subjects swaps order every repeat and each subject takes every position."""
    k = (r // 2) % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if r % 2 else order
