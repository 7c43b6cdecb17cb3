"""Small, undoable monkeypatch helpers the engine patches are made of."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from workbench.adapters.registry import Undo
from workbench.errors import PatchError

MARK = "__workbench_patched__"


def replace_class(module: ModuleType, name: str, new: type, scope: str) -> Undo:
    """Put ``new`` in place of ``module.name`` there and in every loaded ``scope*`` module that
    already imported the old one (``from m import X`` copies the reference)."""
    old = getattr(module, name)
    rebound: list[tuple[ModuleType, str]] = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname == scope or modname.startswith(scope + ".")):
            continue
        for key, value in list(vars(mod).items()):
            if value is old:
                setattr(mod, key, new)
                rebound.append((mod, key))
    setattr(new, MARK, True)

    def undo() -> None:
        for mod, key in rebound:
            setattr(mod, key, old)

    return undo


def wrap_method(cls: type, name: str, make: Callable[[Any], Any]) -> Undo:
    """``cls.name = make(original)``; idempotent per class (a second wrap is refused)."""
    orig = cls.__dict__[name]
    if getattr(orig, MARK, False):
        raise PatchError(f"{cls.__qualname__}.{name} is already patched: a second wrap would "
                         "run the patch twice; undo the first patch before patching again")
    new = make(orig)
    setattr(new, MARK, True)
    setattr(cls, name, new)

    def undo() -> None:
        setattr(cls, name, orig)

    return undo


def need_attrs(obj: Any, *names: str) -> str | None:
    """A check: None if ``obj`` has every attribute, else which are missing."""
    missing = [n for n in names if not hasattr(obj, n)]
    return f"{getattr(obj, '__name__', obj)} lacks {', '.join(missing)}" if missing else None


def need_params(func: Callable, *names: str) -> str | None:
    import inspect

    params = inspect.signature(func).parameters
    missing = [n for n in names if n not in params]
    return (f"{getattr(func, '__qualname__', func)} has no parameter {', '.join(missing)}"
            if missing else None)


def override_method(cls: type, name: str, make: Callable[[Any], Any]) -> Undo:
    """Like :func:`wrap_method` but also for a method ``cls`` inherits (the override is added on
    ``cls`` itself and removed again on undo)."""
    own = name in cls.__dict__
    if own:
        return wrap_method(cls, name, make)
    new = make(getattr(cls, name))
    setattr(new, MARK, True)
    setattr(cls, name, new)

    def undo() -> None:
        delattr(cls, name)

    return undo


def need_fields(cls: type, *names: str) -> str | None:
    """A check for dataclass fields (fields without defaults are not class attributes)."""
    import dataclasses

    have = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    missing = [n for n in names if n not in have]
    return f"{cls.__name__} has no field {', '.join(missing)}" if missing else None


def need_source(func: Callable, *words: str) -> str | None:
    """A check that ``func``'s source still uses each of ``words`` (a protocol that is a
    convention between methods, like SGLang 0.5.16's free-group flag or vLLM 0.34's runner
    handing its cache's ``allocate`` to ``init_kv_cache``, has no signature to check)."""
    import inspect

    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        return f"cannot read the source of {func!r}"
    missing = [w for w in words if w not in src]
    return f"{func.__qualname__} no longer uses {', '.join(missing)}" if missing else None
