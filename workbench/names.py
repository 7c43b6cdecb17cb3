"""Names that become file names (IPC names, segment names): validated here and nowhere else.

An IPC name is the ``<name>`` of ``/dev/shm/wbkv_<name>`` and of a pool's socket directory, so it
must never be a path, a dot-only name, or carry a control character (a trailing newline included:
``re.match(r"...$")`` would let one through, hence ``fullmatch``).
"""

from __future__ import annotations

import re

from workbench.errors import ConfigError

NAME_MAX = 64
NAME_CHARS = "letters, digits, '_', '-' or '.'"
_NAME = re.compile(rf"[A-Za-z0-9_.-]{{1,{NAME_MAX}}}")


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid IPC name, or None if it is."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long (at most {NAME_MAX})"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character (a newline, tab or NUL)"
    if "/" in name or "\\" in name:
        return "contains path separators"
    if not _NAME.fullmatch(name):
        return f"may contain only {NAME_CHARS}"
    if set(name) <= {"."}:
        return "is only dots"
    return None


def is_valid_name(name: object) -> bool:
    return name_problem(name) is None


def check_name(name: object, what: str = "IPC name") -> str:
    """Return ``name`` if it is a valid IPC name, else raise :class:`ConfigError` saying why."""
    why = name_problem(name)
    if why is not None:
        raise ConfigError(f"{what} {name!r}", f"{why}; names are 1-{NAME_MAX} characters of "
                          f"{NAME_CHARS} (no path separators)", "pick a name like 'llama_a'")
    return name  # type: ignore[return-value]
