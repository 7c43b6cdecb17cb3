"""Chapter 11: the CUDA virtual-memory calls in view, on the real driver or the fake one.

:func:`vmm_driver` gives the chapter ``cuda.bindings.driver`` on ``backend="gpu"`` and the
project's :class:`~workbench.gpu.fakedriver.FakeDriver` (same calls, no GPU) anywhere else;
:class:`CallLog` wraps either, records every ``cuMem*`` call and the state of each page of the
one reservation it follows, and :func:`address_figure` draws those states step by step.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

UNRESERVED, RESERVED, MAPPED, ACCESSIBLE = "not reserved", "reserved, no memory", \
    "mapped, no access yet", "mapped, read-write"
STATES = (UNRESERVED, RESERVED, MAPPED, ACCESSIBLE)


def vmm_driver(backend: str) -> tuple[Any, str]:
    """The driver module the chapter calls and a line saying which it is. On ``gpu`` the real
    one, initialised with device 0's primary context current; else the fake one."""
    if backend != "gpu":
        from workbench.gpu.fakedriver import FakeDriver

        return FakeDriver(), "the fake driver (workbench/gpu/fakedriver.py): no GPU, same calls"
    from workbench.backends import require
    from workbench.gpu.driver import call, driver

    require(backend)  # no GPU here: the one-line refusal every chapter gives, before any call
    drv = driver()
    call("cuInit", drv.cuInit, 0)
    dev = call("cuDeviceGet", drv.cuDeviceGet, 0)
    call("cuCtxSetCurrent", drv.cuCtxSetCurrent,
         call("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain, dev))
    name = call("cuDeviceGetName", drv.cuDeviceGetName, 64, dev).split(b"\0", 1)[0].decode()
    return drv, f"the CUDA driver on {name}"


@dataclass
class CallLog:
    """``drv`` with every ``cuMem*`` call recorded: ``rows`` (call, arguments, result) and,
    for the first reservation made through it, ``frames``: each page's state after a call."""

    drv: Any
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    frames: list[tuple[str, list[str]]] = field(default_factory=list)
    base: int = 0
    page: int = 0
    states: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.drv, name)
        if not name.startswith("cuMem"):
            return fn

        def logged(*args: Any) -> Any:
            out = fn(*args)
            self.rows.append((name, _short(args), _short(out[1:]) or "ok" if not out[0]
                              else f"error {int(out[0])}"))
            if not out[0]:
                self._follow(name, args, out)
            return out

        return logged

    def _follow(self, name: str, args: tuple, out: tuple) -> None:
        if name == "cuMemGetAllocationGranularity":
            self.page = int(out[1])
        elif name == "cuMemAddressReserve" and not self.base:
            self.base, self.states = int(out[1]), [RESERVED] * (int(args[0]) // self.page)
        elif name in ("cuMemMap", "cuMemSetAccess", "cuMemUnmap") and self.base:
            first = (int(args[0]) - self.base) // self.page
            new = {"cuMemMap": MAPPED, "cuMemSetAccess": ACCESSIBLE, "cuMemUnmap": RESERVED}
            for i in range(first, first + int(args[1]) // self.page):
                self.states[i] = new[name]
        elif name == "cuMemAddressFree" and int(args[0]) == self.base:
            self.states = [UNRESERVED] * len(self.states)
        else:
            return
        self.frames.append((name, list(self.states)))


def _short(values: tuple) -> str:
    out = []
    for v in values:
        try:
            out.append(f"{int(v):#x}" if int(v) > 1 << 20 else str(int(v)))
        except (TypeError, ValueError):
            out.append(type(v).__name__)
    return ", ".join(out)


def address_figure(log: CallLog, title: str = "One reservation, call by call"):
    """The reservation's pages (columns) after each call (rows, top down), by state."""
    import plotly.graph_objects as go

    from workbench.viz.style import FONT, STATE_COLORS, WHITE, discrete_scale

    colors = [WHITE, STATE_COLORS["free"], STATE_COLORS["reserved"], STATE_COLORS["in_use"]]
    z = [[STATES.index(s) for s in st] for _name, st in log.frames]
    labels = [f"{i + 1}. {name}" for i, (name, _st) in enumerate(log.frames)]
    fig = go.Figure(go.Heatmap(
        z=z, y=labels, x=[f"page {i} (+{i * log.page >> 20} MiB)" for i in range(len(z[0]))],
        colorscale=discrete_scale(colors), zmin=-0.5, zmax=len(colors) - 0.5, xgap=3, ygap=3,
        text=[list(st) for _n, st in log.frames],
        hovertemplate="%{y} · %{x}: %{text}<extra></extra>",
        colorbar=dict(tickvals=list(range(len(STATES))), ticktext=list(STATES))))
    fig.update_layout(title=title, font=FONT, height=90 + 34 * len(z),
                      yaxis=dict(autorange="reversed"), margin=dict(l=200, r=20, t=50, b=40))
    return fig


def zero_page_access(writable: bool) -> str:
    """The access the project's CUDA device grants its zero page (read through the fake
    driver's recorded ``cuMemSetAccess`` flags): ``"read"`` or ``"read-write"``."""
    from workbench.gpu.device import CudaDevice
    from workbench.gpu.driver import use_driver
    from workbench.gpu.fakedriver import FakeDriver

    fake = FakeDriver()
    seen: list[int] = []
    real_set = fake.cuMemSetAccess
    fake.cuMemSetAccess = lambda va, n, desc, k: (seen.append(int(desc[0].flags)),
                                                  real_set(va, n, desc, k))[1]
    with use_driver(fake):
        dev = CudaDevice(zero_writable=writable, fast_path=False)
        va = dev.reserve(4 * dev.granularity)  # unbacked: the zero page goes under it
    dev.unreserve(va, 4 * dev.granularity)
    flags = fake.CUmemAccess_flags
    return {flags.CU_MEM_ACCESS_FLAGS_PROT_READ: "read",
            flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE: "read-write"}[seen[-1]]


_CHILD = """
import torch
from workbench.backends import make_device
dev = make_device("host")
va = dev.reserve(4 * dev.granularity)  # nothing mapped: the read-only zero page shows through
view = dev.tensor(va, 4 * dev.granularity, torch.uint8)
print("read of an unbacked byte:", int(view[123]), flush=True)
view[123] = 7  # a write to the read-only zero page
print("the write went through", flush=True)
"""


def unbacked_write_in_child() -> tuple[int, str]:
    """Write to an unbacked byte of a host reservation in a child interpreter (so the fault
    kills the child, not the kernel): its exit code (negative: the signal) and its output."""
    run = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=60)
    return run.returncode, run.stdout.strip()
