"""Quiz keys out of sight: a packaged quiz file holds no readable answer key.

JupyterLab serves the whole repository, so a plain key (``"correct": true``, a numeric answer, a
feedback line saying "Right") would sit one click from the notebook. A *sealed* file keeps the
prompt, the choice texts, the unit and the source readable and replaces the key:

* each choice's correctness by a salted hash, ``mark = sha256(salt, id, index, 0 or 1)`` cut to
  16 hex digits, which the loader checks against both values;
* the rest of the key (explanation, feedback, a numeric answer and its tolerance) by ``key``:
  that JSON XORed with a pad drawn from ``sha256(salt, id, counter)``, in base64.

This keeps the key from the eye, not from a program: the loader opens it in the kernel (it must,
to grade there), so ``load_chapter_quiz`` hands a determined learner every answer (docs/quiz.md).

Authors edit the open form (the schema of :mod:`workbench.quiz.schema`)::

    python -m workbench.quiz open workbench/quiz/data/02_elastic_memory.json > 02.json
    python -m workbench.quiz close 02.json workbench/quiz/data/02_elastic_memory.json
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Any

from workbench.errors import ConfigError

SEALED = "v1"  # the "sealed" field of a sealed file; a file without it is open
_KEYED = ("explanation", "answer", "tolerance", "feedback")  # what ``key`` carries
_RESEAL = "re-seal it from its open form (python -m workbench.quiz close OPEN SEALED)"


class SealError(ConfigError):
    """A sealed quiz file that does not open; says which question."""


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\0".join(map(str, parts)).encode()).digest()


def mark(salt: str, qid: str, index: int, correct: bool) -> str:
    """The salted hash that stands for choice ``index``'s correctness."""
    return _digest(salt, qid, index, int(correct)).hex()[:16]


def _pad(salt: str, qid: str, n: int) -> bytes:
    blocks = (_digest(salt, qid, "pad", i) for i in range(n // 32 + 1))
    return b"".join(blocks)[:n]


def _xor(data: bytes, salt: str, qid: str) -> bytes:
    return bytes(a ^ b for a, b in zip(data, _pad(salt, qid, len(data)), strict=True))


def seal_question(q: dict, salt: str) -> dict:
    """One open question (schema form) as its sealed form."""
    qid = q["id"]
    out = {k: q[k] for k in ("id", "kind", "prompt", "source", "unit") if k in q}
    key: dict[str, Any] = {k: q[k] for k in _KEYED if k in q}
    if "choices" in q:
        out["choices"] = [{"text": c["text"], "mark": mark(salt, qid, i, c["correct"])}
                          for i, c in enumerate(q["choices"])]
        key["feedback"] = [c["feedback"] for c in q["choices"]]
    raw = json.dumps(key, ensure_ascii=False, sort_keys=True).encode()
    out["key"] = base64.b64encode(_xor(raw, salt, qid)).decode()
    return out


def _correct(c: dict, salt: str, qid: str, i: int, where: str) -> bool:
    for value in (True, False):
        if c.get("mark") == mark(salt, qid, i, value):
            return value
    raise SealError(f"{where}: choice {i}", "its mark matches neither answer", _RESEAL)


def open_question(q: dict, salt: str, where: str) -> dict:
    """One sealed question back in its open (schema) form."""
    qid = q.get("id", "?")
    try:
        key = json.loads(_xor(base64.b64decode(q["key"]), salt, qid))
    except (KeyError, TypeError, ValueError) as err:
        raise SealError(f"{where}: key", f"cannot be opened ({err})", _RESEAL) from err
    out = {k: v for k, v in q.items() if k not in ("key", "choices")}
    if "choices" in q:
        fb = key.pop("feedback", [])
        out["choices"] = [{"text": c.get("text"), "correct": _correct(c, salt, qid, i, where),
                           "feedback": fb[i] if i < len(fb) else None}
                          for i, c in enumerate(q["choices"])]
    return {**out, **key}


def seal_quiz(d: dict, salt: str | None = None) -> dict:
    """An open quiz (schema form) sealed with ``salt`` (a fresh one by default)."""
    salt = salt or secrets.token_hex(8)
    return {"chapter": d["chapter"], "title": d["title"], "sealed": SEALED, "salt": salt,
            "questions": [seal_question(q, salt) for q in d["questions"]]}


def open_quiz(d: Any, where: str = "quiz") -> Any:
    """A sealed quiz in its open (schema) form; anything else is returned as it is."""
    if not isinstance(d, dict) or "sealed" not in d:
        return d
    if d["sealed"] != SEALED or not isinstance(d.get("salt"), str):
        raise SealError(f"{where}: sealed", f"{d['sealed']!r} is not a seal this reads",
                        _RESEAL)
    qs = d.get("questions")
    if not isinstance(qs, list):
        raise SealError(f"{where}: questions", "must be a list", _RESEAL)
    return {"chapter": d.get("chapter"), "title": d.get("title"),
            "questions": [open_question(q, d["salt"], f"{where}: question {i}")
                          if isinstance(q, dict) else q for i, q in enumerate(qs)]}
