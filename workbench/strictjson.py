"""JSON read without guessing and written so strict readers take it back.

Reading (:func:`loads`, :func:`read_file`): an object that names a key twice (``{"n": 1, "n":
200}``, which ``json.loads`` answers with the last), the non-JSON constants ``NaN`` /
``Infinity`` and numbers past a float (``1e999``) are refused with an :class:`AmbiguousJSON`
that names them; nesting deeper than :data:`MAX_DEPTH` is refused too (a ``RecursionError``
otherwise). :func:`read_file` reads a file from outside the process (a regular file, no link,
bounded size, and for ``.gz`` a bounded inflated size) and refuses in one ConfigError line.
Every reader of JSON from outside (traces, worker frames and configs, request bodies, records
and sweeps read back) goes through here.

Writing (:func:`dumps`): a value that is not a finite number (NaN, an infinity) is written as
``null`` and named, by its field path, in the object's ``notes`` list, so the record says what
it could not measure and stays valid JSON.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError

__all__ = ["AmbiguousJSON", "RefusedJSON", "dumps", "loads", "read_file"]

MAX_DEPTH = 64  # the deepest record the workbench writes is under 10
MAX_INFLATED = 32 << 20  # a .gz read back, inflated: a sweep's saved repeats are about 1 MB


class RefusedJSON(ValueError):
    """JSON this workbench will not read."""


class AmbiguousJSON(RefusedJSON):
    """JSON whose meaning would be a guess."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise AmbiguousJSON(f"the key {_short(key)} appears twice in one object")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise AmbiguousJSON(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise AmbiguousJSON(f"{text[:40]} is past the largest float")
    return value


def loads(text: str | bytes, constants: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` as JSON; a duplicate key and nesting past ``max_depth`` refused, and
    ``NaN``/``Infinity``/``1e999`` too unless ``constants`` (a reader whose schema refuses them
    itself, naming the field)."""
    hooks = {} if constants else {"parse_constant": _constant, "parse_float": _float}
    try:
        value = json.loads(text, object_pairs_hook=_object, **hooks)
    except RecursionError:
        raise RefusedJSON(f"nested deeper than {max_depth} levels") from None
    _check_depth(value, max_depth)
    return value


def _check_depth(value: Any, limit: int) -> None:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        if children and depth >= limit:
            raise RefusedJSON(f"nested deeper than {limit} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def read_file(path: str | os.PathLike, what: str, fix: str, max_bytes: int = MAX_INFLATED,
              max_inflated: int = MAX_INFLATED) -> Any:
    """The JSON in ``path`` (gzip-compressed when it ends in ``.gz``), strictly: a regular file
    (not a link) of at most ``max_bytes``, inflating to at most ``max_inflated``; else one
    ConfigError line naming ``what`` and ``path``, with ``fix``."""
    p = Path(path)
    where = f"{what} {ascii(str(p))[1:-1]}"
    try:
        data = _read_regular(p, max_bytes)
        if p.name.endswith(".gz"):
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(max_inflated + 1)
            if len(data) > max_inflated:
                raise RefusedJSON(f"inflates past {max_inflated >> 20} MiB")
        return loads(data)
    except RefusedJSON as err:
        raise ConfigError(where, f"is not strict JSON: {err}", fix) from None
    except (OSError, EOFError, ValueError) as err:  # gzip's BadGzipFile is an OSError
        why = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise ConfigError(where, f"is not readable JSON ({why})", fix) from None


def _read_regular(p: Path, max_bytes: int) -> bytes:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW's answer for a link in the last component
            raise RefusedJSON("is not a regular file (no link)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedJSON("is not a regular file")
        if st.st_size > max_bytes:
            raise RefusedJSON(f"is larger than {max_bytes >> 20} MiB")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise RefusedJSON(f"is larger than {max_bytes >> 20} MiB")
        return data
    finally:
        os.close(fd)


def dumps(obj: Any, *, indent: int | None = None, default: Any = None,
          notes_key: str = "notes") -> str:
    """``obj`` as strict JSON: every non-finite number written as ``null``, and named (its field
    path) in ``obj[notes_key]`` when ``obj`` is an object. ``default`` turns any other value
    into JSON (as ``json.dumps``'s)."""
    notes: list[str] = []
    clean = _finite(obj, "", notes, default)
    if notes and isinstance(clean, dict):
        kept = clean.get(notes_key)
        clean[notes_key] = [*(kept if isinstance(kept, list) else
                              [] if kept is None else [kept]), *notes]
    return json.dumps(clean, indent=indent, allow_nan=False)


def _finite(x: Any, where: str, notes: list[str], default: Any) -> Any:
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        notes.append(f"{where or '(the value)'}: {float(x)!r} is not a JSON number; written as "
                     "null")
        return None
    if x is None or isinstance(x, (str, int)):  # bool is an int
        return x
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            key = k if isinstance(k, str) else json.dumps(k)  # as json.dumps names a key
            out[key] = _finite(v, f"{where}.{key}" if where else key, notes, default)
        return out
    if isinstance(x, (list, tuple)):
        return [_finite(v, f"{where}[{i}]", notes, default) for i, v in enumerate(x)]
    if default is None:
        raise TypeError(f"{type(x).__name__} at {where or '(the value)'} is not JSON")
    return _finite(default(x), where, notes, default)


def _short(key: str) -> str:
    text = json.dumps(key)
    return text if len(text) <= 40 else text[:36] + '..."'
