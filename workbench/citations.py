"""Seed references ("seed 000 §14.3", "seed 003 E5") as links into ``docs/sources.md``.

The three seed documents are not in the repository; ``docs/sources.md`` says what each cited
section asks, under an anchor per section (``seed-000-s14-3``, ``seed-003-e5``). Text made at run
time (a lab's report) cites seeds in plain words; :func:`link_seed_refs` turns each such
reference into a Markdown link a learner can open. A subsection without an entry of its own
links to its section; seed 003 numbers its experiments E1–E9 as sections 3–11, so "§3" is E1.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[1] / "docs" / "sources.md"
NOTEBOOK_BASE = "../docs/sources.md"  # as seen from chapters/ and labs/
_REF = re.compile(r"[Ss]eed (00[013]) (§(\d+(?:\.\d+)*)|E(\d))")
_LINKED = re.compile(r"\[[^\]]*\]\([^)]*\)")
_ANCHOR = re.compile(r'<a id="(seed-[^"]+)"')
_E_SECTIONS = range(3, 12)  # seed 003 §3..§11 are E1..E9


@cache
def anchors() -> frozenset[str]:
    """The seed anchors ``docs/sources.md`` defines (none where the docs are not shipped)."""
    try:
        return frozenset(_ANCHOR.findall(SOURCES.read_text(encoding="utf-8")))
    except OSError:
        return frozenset()


def anchor(seed: str, section: str | None, experiment: str | None) -> str:
    """The anchor of one reference: the most specific section ``docs/sources.md`` has."""
    if experiment:
        return f"seed-{seed}-e{experiment}"
    parts = section.split(".")
    if seed == "003" and int(parts[0]) in _E_SECTIONS:
        return f"seed-003-e{int(parts[0]) - 2}"
    known = anchors()
    while len(parts) > 1 and f"seed-{seed}-s{'-'.join(parts)}" not in known:
        parts.pop()
    return f"seed-{seed}-s{'-'.join(parts)}"


def link_seed_refs(text: str, base: str = NOTEBOOK_BASE) -> str:
    """``text`` with every seed reference not already inside a Markdown link made a link to
    its entry in ``base`` (the path of docs/sources.md from where the text is shown)."""
    out, at = [], 0
    for m in _LINKED.finditer(text):
        out += [_link(text[at:m.start()], base), m[0]]
        at = m.end()
    return "".join(out) + _link(text[at:], base)


def _link(text: str, base: str) -> str:
    return _REF.sub(lambda m: f"[{m[0]}]({base}#{anchor(m[1], m[3], m[4])})", text)


def rebase(text: str, folder: str | os.PathLike) -> str:
    """Text linked for a notebook, relinked for a file written into ``folder``."""
    rel = Path(os.path.relpath(SOURCES, Path(folder).resolve())).as_posix()
    return text.replace(f"]({NOTEBOOK_BASE}#", f"]({rel}#")
