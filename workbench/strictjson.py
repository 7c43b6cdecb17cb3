"""JSON read without guessing: an object that names a key twice (``{"n": 1, "n": 200}``, which
``json.loads`` answers with the last) and the non-JSON constants ``NaN`` / ``Infinity`` are
refused with a :class:`AmbiguousJSON` (a ``ValueError``) that names them. Every reader of JSON from
outside (traces, worker frames and configs, request bodies) goes through :func:`loads`."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["AmbiguousJSON", "loads"]


class AmbiguousJSON(ValueError):
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


def loads(text: str | bytes, constants: bool = False) -> Any:
    """``text`` as JSON; a duplicate key refused, and ``NaN``/``Infinity`` too unless
    ``constants`` (a reader whose schema refuses them itself, naming the field)."""
    return json.loads(text, object_pairs_hook=_object,
                      **({} if constants else {"parse_constant": _constant}))


def _short(key: str) -> str:
    text = json.dumps(key)
    return text if len(text) <= 40 else text[:36] + '..."'
