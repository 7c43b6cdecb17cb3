"""Text from outside on a terminal: a trace's pool name, a file name under the shm folder, an
environment variable's name or value. It is printed as what it says and nothing more: every
control character (ESC, CR, a newline, OSC's BEL, C1 codes, the bidirectional overrides) is
escaped as ``\\x1b``-style text, and for rich it is a :class:`rich.text.Text`, whose ``[red]``
is never read as markup."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["as_text", "plain"]

# C0, DEL, C1; the bidirectional embeddings, overrides and isolates (a name that reads backwards)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def plain(value: object) -> str:
    """``value`` as one line of inert text: every control character escaped."""
    return _CONTROL.sub(_escape, str(value))


def as_text(value: object, style: str | None = None) -> Any:
    """``value`` for a rich table cell, panel title or ``print``: escaped, never markup."""
    from rich.text import Text

    return Text(plain(value), style=style or "")
