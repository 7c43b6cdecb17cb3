"""The one place a name becomes a :class:`~workbench.core.device.Device`.

====================  ===========================================================================
name                  device
====================  ===========================================================================
``sim``               a simulated GPU (SimPy clock, VMM latency presets); works everywhere
``host``              this machine's memory through mmap/memfd (real engines on a CPU)
``gpu``, ``cuda:N``   CUDA virtual memory on GPU ``N`` (``gpu`` is ``cuda:0``)
====================  ===========================================================================

Each name has a lazy factory (nothing heavy is imported until a device is built), a cheap
probe and a :class:`Capabilities` record: code outside this module asks ``capabilities(name)``
what a backend can do instead of testing its name. A name that cannot be honoured here (a
typo, no CUDA GPU visible, cuda-python or torch missing, a GPU index this host lacks) raises
:class:`BackendUnavailable` with one line saying what to do; :func:`probe` asks the same
question without building anything.

In a notebook, importing this module makes every :class:`~workbench.errors.WorkbenchError`
show as that one line (``error: ...``) instead of a traceback, and stop the run there; ``%tb``
still prints the full traceback.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from workbench.core.device import Device
from workbench.errors import ConfigError, WorkbenchError
from workbench.settings import settings


class BackendUnavailable(ConfigError):
    """A device name this process cannot honour: unknown, or its hardware/software is missing."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do, asked instead of its name."""

    kind: str  # the registry entry (``cuda:N`` -> ``gpu``), for records and messages
    simulated: bool  # SimPy time and simulated memory: no real bytes, no tokens
    capacity_settable: bool  # ``make_device(capacity=...)`` sizes the device (a GPU has its own)
    real_processes: bool  # TP/PP workers run as OS processes over the transport
    cuda: bool  # CUDA virtual memory: kernels queued earlier may still read a freed page
    torch_device: str | None  # where an engine on it computes ("cpu", "cuda", "cuda:N"); sim: None

    def gpus(self) -> int:
        """CUDA GPUs visible to this process (0 for a backend without CUDA); asks the driver."""
        return cuda_device_count() if self.cuda else 0


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    summary: str
    build: Callable[..., Device]  # imports its backend only when called
    ignores: tuple[str, ...] = ()  # keys a shared trace may carry that do not apply here
    caps: Capabilities | None = None


def _sim(**kw: Any) -> Device:
    from workbench.sim.device import SimDevice

    return SimDevice(**kw)


def _host(**kw: Any) -> Device:
    from workbench.host.device import HostDevice

    return HostDevice(**kw)


def _cuda(**kw: Any) -> Device:
    from workbench.gpu.device import CudaDevice

    return CudaDevice(**kw)


_SIM_ONLY = ("preset", "env")  # knobs that only describe the simulated GPU
REGISTRY: dict[str, Backend] = {
    "sim": Backend("sim", "simulated GPU (SimPy, VMM latency presets)", _sim,
                   ("zero_writable", "zero_page"),
                   Capabilities("sim", simulated=True, capacity_settable=True,
                                real_processes=False, cuda=False, torch_device=None)),
    "host": Backend("host", "host memory (mmap reservation + memfd pages)", _host,
                    (*_SIM_ONLY, "zero_writable", "zero_page"),
                    Capabilities("host", simulated=False, capacity_settable=True,
                                 real_processes=True, cuda=False, torch_device="cpu")),
    "gpu": Backend("gpu", "CUDA virtual memory (cuda-python, torch views)", _cuda,
                   (*_SIM_ONLY, "capacity"),
                   Capabilities("gpu", simulated=False, capacity_settable=False,
                                real_processes=True, cuda=True, torch_device="cuda")),
}
BACKENDS = tuple(REGISTRY)  # the names a CLI offers; "cuda:N" is accepted too


def _unavailable(name: str, why: str, fix: str = 'use backend="sim"') -> BackendUnavailable:
    return BackendUnavailable(f"backend {name!r}", why, fix)


def _parse(name: str) -> tuple[Backend, int | None]:
    """The backend a name selects and, for ``cuda:N``, the GPU index."""
    if name in REGISTRY:
        return REGISTRY[name], 0 if name == "gpu" else None
    kind, sep, index = str(name).partition(":")
    if kind == "cuda" and sep:
        if not index.isdigit():
            raise _unavailable(name, "the GPU index must be a whole number (cuda:0, cuda:1, ...)",
                               'write cuda:N with N >= 0, or use backend="sim"')
        return REGISTRY["gpu"], int(index)
    raise _unavailable(name, "unknown device name",
                       f"use one of {', '.join(BACKENDS)} or cuda:N")


@lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """CUDA GPUs the driver shows this process (honours CUDA_VISIBLE_DEVICES); 0 when there is
    no driver. Asks libcuda directly, so it needs neither cuda-python nor torch; like building a
    CUDA device it initialises the driver in this process."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cu = ctypes.CDLL(lib)
            break
        except OSError:
            continue
    else:
        return 0
    count = ctypes.c_int(0)
    if cu.cuInit(0) != 0 or cu.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is missing or half-installed
        return False


def _gpu_problem(name: str, index: int) -> BackendUnavailable | None:
    count = cuda_device_count()
    if count == 0:
        return _unavailable(name, "no CUDA GPU is visible here")
    if index >= count:
        return _unavailable(name, f"this host shows {count} CUDA GPU(s), cuda:0 to "
                            f"cuda:{count - 1}", 'pick one of those, or use backend="sim"')
    has_cuda_python = _has_module("cuda.bindings") or _has_module("cuda.cuda")  # 12.x layout
    for ok, what in ((has_cuda_python, "cuda-python"), (_has_module("torch"), "torch")):
        if not ok:
            return _unavailable(name, f"{what} is not installed",
                                "pip install 'kv-cache-workbench[gpu]' (and a CUDA build of "
                                'torch), or use backend="sim"')
    return None


def _problem(name: str) -> tuple[Backend, int | None, BackendUnavailable | None]:
    try:
        backend, index = _parse(name)
    except BackendUnavailable as err:
        return REGISTRY["sim"], None, err
    if backend.name == "gpu":
        return backend, index, _gpu_problem(name, index or 0)
    return backend, index, None


def for_torch_device(engine_device: Any) -> str:
    """The backend name for an engine's torch device: ``host`` for ``cpu``, ``cuda:N`` for a
    GPU (``cuda`` alone is the current one); another kind is refused in one line."""
    text = str(engine_device)
    kind_, _, index = text.partition(":")
    if kind_ == "cpu":
        return "host"
    if kind_ != "cuda":
        raise _unavailable(text, "the workbench's devices are the host (cpu) and CUDA GPUs "
                           "(cuda:N)", "run the engine on CPU or CUDA")
    if not index:
        import torch

        index = str(torch.cuda.current_device())
    return f"cuda:{int(index)}"


_shared: dict[str, Device] = {}


def shared_device(engine_device: Any) -> Device:
    """The process's one device for an engine's torch device (``cpu``, ``cuda``, ``cuda:N``; see
    :func:`for_torch_device`), built by the first call and kept: every pool on that GPU in this
    process shares it, as they share the GPU (vLLM's and SGLang's adapters both ask here). An
    engine writes warm-up, padding and graph-capture tokens to slots whose pages are not backed
    yet, so a CUDA device maps its zero page read-write: such a write lands somewhere harmless
    instead of faulting (the host's unbacked memory takes writes already)."""
    name = for_torch_device(engine_device)
    if name not in _shared:
        _shared[name] = make_device(name, zero_writable=True)  # (the host ignores it)
    return _shared[name]


def probe(name: str) -> tuple[bool, str]:
    """Whether ``name`` can be built here, and why not (``""`` when it can); builds nothing."""
    _, _, err = _problem(name)
    return (True, "") if err is None else (False, str(err))


def kind(name: str) -> str:
    """The registry entry ``name`` selects (``cuda:N`` -> ``gpu``); an unknown name is refused."""
    return _parse(name)[0].name


def capabilities(name: str) -> Capabilities:
    """What backend ``name`` can do (``cuda:N``: the gpu entry, its torch device ``cuda:N``);
    an unknown name is refused; builds nothing and asks no driver."""
    chosen, index = _parse(name)
    caps = chosen.caps
    assert caps is not None  # every registry entry carries its record
    if chosen.name == "gpu" and name != "gpu":
        return dataclasses.replace(caps, torch_device=f"cuda:{index}")
    return caps


def require(name: str) -> str:
    """The backend kind ``name`` selects (``cuda:N`` -> ``gpu``), or :class:`BackendUnavailable`
    when it cannot be built here; builds nothing."""
    chosen, _, err = _problem(name)
    if err is not None:
        raise err
    return chosen.name


def make_device(backend: str = "sim", **kw: Any) -> Device:
    """A new device for ``backend`` (see the module table); ``kw`` go to its constructor, minus
    the keys that only describe the simulated GPU when the device is real."""
    chosen, index, err = _problem(backend)
    if err is not None:
        raise err
    budget = kw.pop("gpu_budget", None)
    kw = {k: v for k, v in kw.items() if k not in chosen.ignores}
    if index is not None:
        if kw.setdefault("device_index", index) != index:
            raise ConfigError(f"device_index={kw['device_index']} with backend {backend!r}",
                              "the name already picks a GPU", "pass one of the two")
    try:
        return _budgeted(chosen.name, chosen.build(**kw), budget)
    except WorkbenchError as exc:
        if chosen.name != "gpu" or isinstance(exc, ConfigError):
            raise
        raise _unavailable(backend, f"the CUDA device cannot be opened ({exc})",
                           'check the GPU with nvidia-smi, or use backend="sim"') from exc


def _budgeted(kind: str, device: Device, total: int | None) -> Device:
    """A real device charged to its GPU's shared budget when one is asked for (``gpu_budget=``
    bytes, else ``WORKBENCH_KV_GPU_BUDGET``; 0 turns it off). The simulated GPU lives in one
    process and keeps its own capacity."""
    if kind == "sim":
        return device
    if total is None:
        total = settings(only="gpu_budget").gpu_budget
    if not total:
        return device
    from workbench.core.budget_device import budgeted

    return budgeted(device, total)


# -- notebooks: a WorkbenchError is one line, not a traceback -------------------------------------
def _one_line(shell: Any, etype: type, value: BaseException, tb: Any,
              tb_offset: int | None = None) -> None:
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # for %tb and %debug
    shell._showtraceback(etype, value, ["error: " + " ".join(str(value).split())])


def install_notebook_errors() -> bool:
    """In IPython, show a WorkbenchError as ``error: <message>`` and stop the run (the cell
    still fails, so "run all" halts there). Other handlers a user installed are left alone."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if shell.custom_exceptions not in ((), (WorkbenchError,)):
        return False
    shell.set_custom_exc((WorkbenchError,), _one_line)
    return True


install_notebook_errors()
