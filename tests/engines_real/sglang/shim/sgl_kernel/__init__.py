"""Import-only stand-in for ``sgl_kernel`` (SGLang's CUDA kernel wheel, built for one torch).

For test boxes only: SGLang's quantization modules import ``sgl_kernel`` names at import time,
through ``mem_cache/memory_pool``. The memory-pool, allocator and radix-cache paths the GPU tests
drive never call a kernel from it, so every name here is an inert placeholder; calling one raises,
so a test that did reach a kernel fails loudly instead of computing nonsense.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class Placeholder:
    """Any attribute chain of the stand-in; using it as a function says so."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is a test stand-in for sgl_kernel: no kernel here "
                           "(install the real sgl_kernel to run SGLang's compute)")

    def __getitem__(self, key) -> Placeholder:
        return Placeholder(f"{self._name}[]")

    def __iter__(self):
        return iter(())

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self.__name__}.{name}")


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _Module(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module) -> None:
        pass


sys.meta_path.append(_Submodules())
__path__: list[str] = []
__version__ = "0.0.0+workbench-test-stand-in"


def __getattr__(name: str) -> Placeholder:
    if name.startswith("__"):
        raise AttributeError(name)
    return Placeholder(f"{__name__}.{name}")
