"""The import hook: a meta-path finder that runs a callback right after a watched module loads.

It finds the real spec with the finders behind it and wraps the loader; everything else the
loader offers (``get_data``, resource readers, ``is_package``) passes through unchanged.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType

Callback = Callable[[str, ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, finder: PatchFinder):
        self._inner = inner
        self._finder = finder

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        self._finder.loading.add(name)
        try:
            self._inner.exec_module(module)
        finally:
            self._finder.loading.discard(name)
        self._finder.fire(name, module)

    def __getattr__(self, item):
        return getattr(self._inner, item)


class PatchFinder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.watch: dict[str, list[Callback]] = {}
        self.prefixes: dict[str, list[Callback]] = {}  # package -> callbacks for every module
        self.loading: set[str] = set()
        self._resolving: set[str] = set()

    def on_load(self, module: str, callback: Callback) -> None:
        """Run ``callback(name, module)`` after ``module`` executes (now, if already loaded)."""
        self.watch.setdefault(module, []).append(callback)
        loaded = sys.modules.get(module)
        if loaded is not None and module not in self.loading:
            callback(module, loaded)

    def on_package(self, package: str, callback: Callback) -> None:
        """Run ``callback(name, module)`` after every module of ``package`` executes."""
        self.prefixes.setdefault(package, []).append(callback)

    def _package_of(self, name: str) -> str | None:
        top = name.partition(".")[0]
        return top if top in self.prefixes else None

    def fire(self, name: str, module: ModuleType) -> None:
        for cb in list(self.watch.get(name, ())):
            cb(name, module)
        pkg = self._package_of(name)
        for cb in list(self.prefixes.get(pkg, ())) if pkg else ():
            cb(name, module)

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if fullname in self._resolving or (fullname not in self.watch
                                           and self._package_of(fullname) is None):
            return None
        self._resolving.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._resolving.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec


_finder: PatchFinder | None = None


def finder() -> PatchFinder:
    """The process's one finder, first on ``sys.meta_path``."""
    global _finder
    if _finder is None:
        _finder = PatchFinder()
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return _finder


def remove() -> None:
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
