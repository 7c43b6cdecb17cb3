"""The KV every part of ``workbench bench vmm`` measures, and its raw baselines: one page id's
driver calls issued bare, from Python through ``cuda.bindings`` (:class:`_Raw`, the issue's "raw
driver") and from the C library in one call each way (:class:`RawC`, the floor the C fast path can
approach).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from workbench.core.geometry import KVGeometry, Layout
from workbench.engines.models import get_model
from workbench.gpu.device import CudaDevice
from workbench.gpu.driver import call, driver
from workbench.gpu.fastcalls import HEAD, J_M, J_N, J_STAGE, T_WORDS, TARGET, FastCalls


def model_geometry(layout: Layout, num_pages: int, num_layers: int = 32) -> KVGeometry:
    """Llama-3.1-8B's KV (32 layers, 8 KV heads x 128, bf16, 16-token blocks: 32 KiB), 64
    blocks a page id; ``num_layers``: fewer layers for a quick run."""
    spec = replace(get_model("llama-3.1-8b"), num_layers=num_layers)
    return spec.geometry(64 * num_pages, layout=layout)


class _Raw:
    """Bare driver calls over one page id's targets (no Python layer above ``cuda.bindings``)."""

    def __init__(self, dev: CudaDevice, geo: KVGeometry, pages: int, zero: bool):
        self.cu, self.dev, self.geo, self.zero = driver(), dev, geo, zero
        self.g = dev.granularity
        self.size = geo.page_id_bytes * pages
        self.base = int(call("reserve", self.cu.cuMemAddressReserve, self.size, self.g, 0, 0))
        self.n = geo.maps_per_page
        self.tsize = geo.page_id_bytes // self.n
        self.zh = None
        if zero:  # the ideal zero page: one piece per target, laid out in advance
            self.zh = call("create", self.cu.cuMemCreate, self.tsize, dev._prop, 0)
            for page in range(pages):
                for va in self._targets(page):
                    call("map", self.cu.cuMemMap, va, self.tsize, 0, self.zh, 0)
            call("set_access", self.cu.cuMemSetAccess, self.base, self.size, self._zdesc(), 1)
        self.handles: dict[int, list[Any]] = {}

    def _zdesc(self) -> list[Any]:
        return self.dev._ro if self.dev.zero_access == "read" else self.dev._rw

    def _targets(self, page: int) -> list[int]:
        g = self.geo
        if g.layout is Layout.CONTIGUOUS:
            return [self.base + page * g.page_id_bytes]
        region = g.num_pages * g.page_size
        return [self.base + i * region + page * g.page_size for i in range(self.n)]

    def grow(self, page: int) -> None:
        cu, s, prop, rw = self.cu, self.tsize, self.dev._prop, self.dev._rw
        hs = []
        for va in self._targets(page):
            if self.zero:
                cu.cuMemUnmap(va, s)
            err, h = cu.cuMemCreate(s, prop, 0)
            cu.cuMemMap(va, s, 0, h, 0)
            cu.cuMemSetAccess(va, s, rw, 1)
            hs.append(h)
        self.handles[page] = hs

    def shrink(self, page: int) -> None:
        cu, s = self.cu, self.tsize
        for va, h in zip(self._targets(page), self.handles.pop(page), strict=True):
            cu.cuMemUnmap(va, s)
            cu.cuMemRelease(h)
            if self.zero:
                cu.cuMemMap(va, s, 0, self.zh, 0)
                cu.cuMemSetAccess(va, s, self._zdesc(), 1)

    def close(self) -> None:
        for page in list(self.handles):
            self.shrink(page)
        if self.zero:
            self.cu.cuMemUnmap(self.base, self.size)
            self.cu.cuMemRelease(self.zh)
        self.cu.cuMemAddressFree(self.base, self.size)



class RawC(_Raw):
    """:class:`_Raw`'s calls from the C library, one C call per grow and per shrink: create,
    (the zero piece's unmap), map, set_access per target; unmap, release, (the zero piece's map
    and set_access). ``fast``: a :class:`FastCalls` of its own (its job buffer)."""

    def __init__(self, dev: CudaDevice, geo: KVGeometry, pages: int, zero: bool,
                 fast: FastCalls):
        super().__init__(dev, geo, pages, zero)
        self.fast = fast
        fast.ensure(self.n)
        fast.bind(dev._prop, dev._rw, dev._ro)
        fast.zero_desc(self._zdesc())

    def grow(self, page: int) -> None:
        fast = self.fast
        call_map, _, arg, words, raw = fast.hot
        for i, va in enumerate(self._targets(page)):
            TARGET.pack_into(raw, 8 * (HEAD + T_WORDS * i), va, self.tsize, self.zero)
        words[J_N] = self.n
        if call_map(arg):
            raise fast.error(words[J_STAGE])
        self.handles[page] = fast.out(self.n)

    def shrink(self, page: int) -> None:
        fast = self.fast
        _, call_unmap, arg, words, raw = fast.hot
        zh = int(self.zh) if self.zero else 0
        base = HEAD + T_WORDS * self.n
        for i, (va, h) in enumerate(zip(self._targets(page), self.handles.pop(page),
                                        strict=True)):
            TARGET.pack_into(raw, 8 * (HEAD + T_WORDS * i), va, self.tsize, zh)
            words[base + i] = h
        words[J_N] = words[J_M] = self.n
        if call_unmap(arg):
            raise fast.error(words[J_STAGE])

    def close(self) -> None:
        super().close()
        self.fast.close()


def raw_subjects(dev_n: CudaDevice, dev_z: CudaDevice, geo: KVGeometry,
                 pages: int) -> dict[str, Any]:
    """The raw subjects: bare calls from Python, and from C where the fast path loads."""
    from workbench.gpu.fastcalls import for_driver

    out: dict[str, Any] = {"raw": _Raw(dev_n, geo, pages, zero=False),
                           "raw_zero": _Raw(dev_z, geo, pages, zero=True)}
    for name, dev, zero in (("raw_c", dev_n, False), ("raw_zero_c", dev_z, True)):
        fast, _ = for_driver(driver())
        if fast is not None:
            out[name] = RawC(dev, geo, pages, zero, fast)
    return out
