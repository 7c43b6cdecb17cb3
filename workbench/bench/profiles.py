"""Fitted step-time profiles written into ``workbench/hardware.py``'s profile block.

The block between ``# >>> step profiles`` and ``# <<< step profiles`` holds one literal dict
(``STEP_PROFILES``); writing a profile reads that dict back (``ast.literal_eval``: plain
literals only), sets the one name and writes the block again, sorted by name, every line under
the project's 100 columns. Nothing else in the file is touched.
"""

from __future__ import annotations

import ast
from pathlib import Path

from workbench.errors import ConfigError
from workbench.outfiles import write_text

BEGIN, END = "# >>> step profiles\n", "# <<< step profiles\n"
HEAD = "STEP_PROFILES: dict[str, dict] = "
DEFAULT = Path(__file__).resolve().parents[1] / "hardware.py"
WIDTH = 96


def _split(text: str, path: Path) -> tuple[str, str, str]:
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        raise ConfigError(f"{path}", "has no step-profile block",
                          f"restore the lines {BEGIN.strip()!r} ... {END.strip()!r}")
    return text[:a + len(BEGIN)], text[a + len(BEGIN):b], text[b:]


def read_profiles(path: Path = DEFAULT) -> dict[str, dict]:
    _, body, _ = _split(path.read_text(), path)
    literal = body.strip()
    if not literal.startswith(HEAD):
        raise ConfigError(f"{path} step-profile block", f"does not start with {HEAD.strip()!r}",
                          "regenerate it by re-fitting")
    try:
        got = ast.literal_eval(literal[len(HEAD):])
    except (ValueError, SyntaxError) as err:
        raise ConfigError(f"{path} step-profile block", f"is not a literal ({err})",
                          "regenerate it by re-fitting") from None
    return got


def _literal(value: object, indent: int) -> list[str]:
    """``value`` as source lines at ``indent``: dicts one key a line, long strings split at
    spaces into adjacent literals inside parentheses."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = ["{"]
        for k, v in value.items():
            sub = _literal(v, indent + 4)
            lines.append(f"{pad}    {k!r}: {sub[0]}")
            lines += sub[1:]
            lines[-1] += ","
        return lines + [pad + "}"]
    text = repr(value)
    if isinstance(value, (list, tuple)) and indent + len(text) >= WIDTH - 24:
        lines = ["["]
        for v in value:
            sub = _literal(v, indent + 4)
            lines += [f"{pad}    {sub[0]}", *sub[1:]]
            lines[-1] += ","
        return lines + [pad + "]"]
    if not isinstance(value, str) or indent + len(text) < WIDTH - 24:
        return [text]
    words, parts, cur = value.split(" "), [], ""
    for w in words:
        if cur and len(repr(cur + " " + w)) > WIDTH - indent - 8:
            parts.append(cur + " ")
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    parts.append(cur)
    return ["("] + [f"{pad}    {p!r}" for p in parts] + [pad + ")"]


def render(profiles: dict[str, dict]) -> str:
    return HEAD + "\n".join(_literal(dict(sorted(profiles.items())), 0)) + "\n"


def write_profile(name: str, profile: dict, path: Path = DEFAULT) -> Path:
    """Set ``STEP_PROFILES[name] = profile`` in ``path``'s block; the file is otherwise kept."""
    text = path.read_text()
    head, _, tail = _split(text, path)
    profiles = read_profiles(path)
    profiles[name] = profile
    new = head + render(profiles) + tail
    compile(new, str(path), "exec")  # never leave the module broken
    return write_text(path, new, "profiles file")  # atomic: an import mid-write sees one
