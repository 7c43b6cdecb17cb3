"""One import point for cuda-python's driver API, and its status codes as typed errors.

Every ``cuda.bindings.driver`` call returns ``(CUresult, *values)``; a missing driver library raises
instead (cuda-pathfinder). Both become :class:`~workbench.errors.DeviceError`, so nothing aborts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.errors import DeviceError

_driver: Any = None

# Messages that must read the same as the simulated device's, so event traces compare equal.
_MESSAGES = {"CUDA_ERROR_OUT_OF_MEMORY": "out of memory"}


def driver() -> Any:
    """The ``cuda.bindings.driver`` module (cuda-python >= 12.6), or the older ``cuda.cuda``."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as mod
        except ImportError:
            try:
                from cuda import cuda as mod  # cuda-python 12.x before the bindings split
            except ImportError as err:
                raise DeviceError("import", "cuda-python is not installed: "
                                            "pip install 'kv-cache-workbench[gpu]'") from err
        _driver = mod
    return _driver


@contextmanager
def use_driver(mod: Any) -> Iterator[Any]:
    """Answer :func:`driver` with ``mod`` inside the block (a :class:`~workbench.gpu.fakedriver.
    FakeDriver` on a CPU host); devices made inside keep it after the block ends."""
    global _driver
    old, _driver = _driver, mod
    try:
        yield mod
    finally:
        _driver = old


def error_name(err: Any) -> str:
    try:
        res, name = driver().cuGetErrorName(err)
        if not res and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - naming an error must never raise a second one
        pass
    return str(err)


def fail(op: str, err: Any) -> DeviceError:
    """The DeviceError for a non-zero CUresult ``err`` returned by ``op``."""
    name = error_name(err)
    return DeviceError(op, _MESSAGES.get(name, name), name)


def call(op: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, unpacked: None, one value or a tuple; raises DeviceError on any failure."""
    try:
        out = fn(*args)
    except DeviceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a missing library or a bad argument
        raise DeviceError(op, f"{type(exc).__name__}: {exc}") from exc
    if out[0]:
        raise fail(op, out[0])
    if len(out) == 1:
        return None
    return out[1] if len(out) == 2 else out[1:]
