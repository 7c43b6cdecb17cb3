"""The C fast path to the driver: one C call per page id's batch (``vmmfast.c``, via ctypes).

``make`` builds ``_vmmfast.so`` next to this file when a C compiler exists (no CUDA toolkit:
the C side opens the driver library at run time). :func:`for_driver` picks the path once per
device: the library and a driver module backed by a C library (``cuda.bindings``: the real
driver's soname; a test's fake: its ``C_LIBRARY``) give a :class:`FastCalls`; anything else
(no library, a pure-Python fake driver, a driver library that does not open) gives None and
:class:`~workbench.gpu.device.CudaDevice` keeps its Python batch. Nothing is read from the
environment.

A call's inputs and outputs travel in one buffer of 64-bit words (the layout ``vmmfast.c``
names): header words, then four per target, then the handles of an unmap+release.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import Any

from workbench.errors import DeviceError

LIBRARY = Path(__file__).with_name("_vmmfast.so")
DRIVER_SONAME = "libcuda.so.1"

# header words (vmmfast.c's J_*), per-target words, stages (S_*)
J_DRIVER, J_PROP, J_RW, J_ZDESC, J_N, J_M, J_STAGE, J_CODE, J_DONE, J_RELEASED = range(10)
HEAD, T_WORDS = 16, 4
OUT0 = HEAD + 3  # the first target's out word
S_OK, S_CREATE, S_ZERO_UNMAP, S_MAP, S_ACCESS, S_UNMAP, S_RELEASE = range(7)
STAGE_OP = {S_CREATE: "create", S_ZERO_UNMAP: "cuMemUnmap(zero)", S_MAP: "map",
            S_ACCESS: "set_access", S_UNMAP: "unmap", S_RELEASE: "release"}
TARGET = struct.Struct("=3Q")  # a target's va, size, in: packed at byte 8 * (HEAD + 4 i)


def address(obj: Any) -> int:
    """The address of a driver struct: cuda.bindings objects have ``getPtr()``; a ctypes one
    (a test's fake driver) is its own buffer."""
    get = getattr(obj, "getPtr", None)
    return int(get()) if get is not None else ctypes.addressof(obj)


def driver_library(cu: Any) -> str | None:
    """The C library behind driver module ``cu``, or None when it has none (a Python fake)."""
    own = getattr(cu, "C_LIBRARY", None)
    if own is not None:
        return str(own)
    name = getattr(cu, "__name__", "")
    return DRIVER_SONAME if name in ("cuda.bindings.driver", "cuda.cuda") else None


def for_driver(cu: Any, library: Path | None = None) -> tuple[FastCalls | None, str]:
    """The fast path for driver module ``cu`` and why (a FastCalls, or None and the reason);
    ``library``: the C library (default :data:`LIBRARY`, where ``make`` builds it)."""
    library = LIBRARY if library is None else library
    drv = driver_library(cu)
    if drv is None:
        return None, "off: the driver module is not backed by a C library"
    if not library.exists():
        return None, f"off: {library.name} is not built (make vmmfast)"
    try:
        return FastCalls(library, drv, cu), f"on ({drv})"
    except DeviceError as err:
        return None, f"off: {err}"


class FastCalls:
    """The C library opened against one driver library, with one job buffer (one device's)."""

    __slots__ = ("_lib", "_drv", "_map", "_unmap_release", "_buf", "_arg", "words", "raw",
                 "capacity", "driver_path", "_result", "descs", "hot", "lock")

    def __init__(self, library: Path | str, driver_path: str, cu: Any = None):
        try:
            lib = ctypes.CDLL(os.fspath(library))
            lib.wb_open.restype = ctypes.c_void_p
            lib.wb_open.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
            lib.wb_close.argtypes = (ctypes.c_void_p,)
            self._map, self._unmap_release = lib.wb_map, lib.wb_unmap_release
        except (OSError, AttributeError) as err:
            raise DeviceError("fast path", f"cannot load {library}: {err}; the Python batch "
                              "is used (rebuild with make vmmfast)") from err
        why = ctypes.create_string_buffer(512)
        drv = lib.wb_open(os.fsencode(driver_path), why, 512)
        if not drv:
            raise DeviceError("fast path", f"cannot open the driver library {driver_path}: "
                              f"{why.value.decode(errors='replace')}; the Python batch is used")
        self._lib, self._drv, self.driver_path = lib, drv, driver_path
        self._map.argtypes = self._unmap_release.argtypes = (ctypes.c_void_p,)
        # the driver module's status type, so errors name the code as the Python path does
        self._result = getattr(cu, "CUresult", None)
        self.capacity = 0
        self.descs: dict[int, int] = {}
        # one job buffer, and the C call releases the GIL: pools of one device on several
        # threads take turns from packing a batch to reading its outcome
        self.lock = threading.Lock()
        self._grow(64)

    def _grow(self, n: int) -> None:
        """A job buffer for ``n`` targets (and ``n`` handles); the header carries over."""
        head = self.words[:HEAD].tolist() if self.capacity else [0] * HEAD
        buf = bytearray(8 * (HEAD + (T_WORDS + 1) * n))
        self._buf = (ctypes.c_char * len(buf)).from_buffer(buf)  # pins buf's address
        self._arg = ctypes.c_void_p(ctypes.addressof(self._buf))
        self.raw = buf  # bytes, for struct packing
        self.words = memoryview(buf).cast("Q")
        for i, w in enumerate(head):
            self.words[i] = w
        self.words[J_DRIVER] = self._drv
        self.capacity = n
        # what a batch reads, in one unpacking: the two calls, their argument, the buffer
        self.hot = (self._map, self._unmap_release, self._arg, self.words, buf)

    def ensure(self, n: int) -> None:
        if n > self.capacity:
            self._grow(max(n, 2 * self.capacity))

    def bind(self, prop: Any, rw: list, ro: list) -> None:
        """The device's allocation prop and its one-descriptor access lists (read-write, read),
        by address: they live as long as the device. ``descs`` maps a list's id to its address
        (the zero page names its descriptor by the list it took)."""
        self.words[J_PROP] = address(prop)
        self.words[J_RW] = address(rw[0])
        self.descs = {id(rw): address(rw[0]), id(ro): address(ro[0])}

    def zero_desc(self, desc: list) -> None:
        """The descriptor the zero pieces go back with (one of :meth:`bind`'s lists)."""
        self.words[J_ZDESC] = self.descs[id(desc)]

    def out(self, n: int) -> list[int]:
        """The out word of the first ``n`` targets."""
        return self.words[OUT0:OUT0 + T_WORDS * n:T_WORDS].tolist()

    def error(self, stage: int) -> DeviceError:
        """The DeviceError the Python path raises for the driver status the C call stopped at."""
        from workbench.gpu.driver import fail

        code: Any = self.words[J_CODE]
        if self._result is not None:
            try:
                code = self._result(code)
            except ValueError:
                pass
        return fail(STAGE_OP[stage], code)

    def close(self) -> None:
        if self._drv:
            self._lib.wb_close(self._drv)
            self._drv = self.words[J_DRIVER] = 0
