"""Quiz questions as data: one JSON file per chapter (``workbench/quiz/data/NN_name.json``,
shipped with the package), checked here before anything shows them.

A quiz file::

    {"chapter": "02", "title": "...", "questions": [QUESTION, ...]}

A question has ``id``, ``kind`` (``single`` | ``multiple`` | ``numeric``), ``prompt`` and
``explanation`` (shown after any answer), optionally ``source`` (a Markdown link into
docs/sources.md, e.g. "[001 §13](../docs/sources.md#seed-001-s13)"). Choice questions carry
``choices``: ``{"text", "correct", "feedback"}`` each, with feedback for every choice;
``single`` has exactly one correct choice, ``multiple`` at least one. A numeric question carries
``answer``, ``tolerance`` (absolute, >= 0), optional ``unit`` and ``feedback`` with ``correct``,
``low`` and ``high`` texts. That is the *open* form an author writes; the packaged files are
sealed (:mod:`workbench.quiz.seal`) and :func:`load_quiz` opens them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, NotFoundError
from workbench.quiz.seal import open_quiz

KINDS = ("single", "multiple", "numeric")
_Q_KEYS = {"id", "kind", "prompt", "explanation", "source", "choices", "answer", "tolerance",
           "unit", "feedback"}
_CHOICE_KEYS = {"text", "correct", "feedback"}
_NUM_FEEDBACK = ("correct", "low", "high")


class QuizSchemaError(ConfigError):
    """A quiz file that does not follow the schema; says which question and field."""


@dataclass(frozen=True, slots=True)
class Choice:
    text: str
    correct: bool
    feedback: str


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    kind: str
    prompt: str
    explanation: str
    choices: tuple[Choice, ...] = ()
    answer: float | None = None
    tolerance: float = 0.0
    unit: str = ""
    feedback: dict[str, str] | None = None  # numeric: correct / low / high
    source: str = ""

    @property
    def correct_indices(self) -> frozenset[int]:
        return frozenset(i for i, c in enumerate(self.choices) if c.correct)


@dataclass(frozen=True, slots=True)
class Quiz:
    chapter: str
    title: str
    questions: tuple[Question, ...]

    def __len__(self) -> int:
        return len(self.questions)

    def question(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise NotFoundError(f"question {qid!r}", "this quiz has no question with that id",
                            f"use one of {', '.join(q.id for q in self.questions)}")


def _fail(where: str, why: str, fix: str) -> QuizSchemaError:
    return QuizSchemaError(where, why, fix)


def _text(d: dict, key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v.strip():
        raise _fail(f"{where}: {key}", "must be a non-empty string", f"write the {key} text")
    return v


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(where, f"{v!r} is not a finite number", "write a plain number")
    return float(v)


def parse_question(d: Any, where: str = "question") -> Question:
    if not isinstance(d, dict):
        raise _fail(where, "must be an object", "write the question as a JSON object")
    extra = set(d) - _Q_KEYS
    if extra:
        raise _fail(where, f"unknown keys {sorted(extra)}", f"use only {sorted(_Q_KEYS)}")
    qid = _text(d, "id", where)
    where = f"question {qid!r}"
    kind = d.get("kind")
    if kind not in KINDS:
        raise _fail(f"{where}: kind", f"{kind!r} is not a question kind", f"use one of {KINDS}")
    prompt, explanation = _text(d, "prompt", where), _text(d, "explanation", where)
    source = d.get("source", "")
    if not isinstance(source, str):
        raise _fail(f"{where}: source", "must be a string",
                    'e.g. "[001 §13](../docs/sources.md#seed-001-s13)"')
    if kind == "numeric":
        if "choices" in d:
            raise _fail(where, "a numeric question has no choices", "drop choices")
        if "answer" not in d:
            raise _fail(f"{where}: answer", "is missing", "give the expected number")
        answer = _number(d["answer"], f"{where}: answer")
        tol = _number(d.get("tolerance", 0), f"{where}: tolerance")
        if tol < 0:
            raise _fail(f"{where}: tolerance", "is negative", "use 0 or more")
        fb = d.get("feedback")
        if not isinstance(fb, dict) or set(fb) != set(_NUM_FEEDBACK):
            raise _fail(f"{where}: feedback", f"needs exactly the keys {_NUM_FEEDBACK}",
                        "give feedback for a correct, a too-low and a too-high answer")
        for k in _NUM_FEEDBACK:
            _text(fb, k, f"{where}: feedback")
        unit = d.get("unit", "")
        if not isinstance(unit, str):
            raise _fail(f"{where}: unit", "must be a string", 'e.g. "blocks"')
        return Question(qid, kind, prompt, explanation, answer=answer, tolerance=tol, unit=unit,
                        feedback=dict(fb), source=source)
    for k in ("answer", "tolerance", "unit", "feedback"):
        if k in d:
            raise _fail(where, f"a {kind} question has no {k!r}",
                        "put feedback on each choice instead")
    raw = d.get("choices")
    if not isinstance(raw, list) or len(raw) < 2:
        raise _fail(f"{where}: choices", "needs a list of at least 2 choices", "add choices")
    choices = []
    for i, c in enumerate(raw):
        cw = f"{where}: choice {i}"
        if not isinstance(c, dict) or set(c) != _CHOICE_KEYS:
            raise _fail(cw, f"needs exactly the keys {sorted(_CHOICE_KEYS)}",
                        "give text, correct (true/false) and feedback")
        if not isinstance(c["correct"], bool):
            raise _fail(f"{cw}: correct", "must be true or false", "use a JSON boolean")
        choices.append(Choice(_text(c, "text", cw), c["correct"], _text(c, "feedback", cw)))
    texts = [c.text for c in choices]
    if len(set(texts)) != len(texts):
        raise _fail(f"{where}: choices", "two choices have the same text", "make them distinct")
    n_right = sum(c.correct for c in choices)
    if kind == "single" and n_right != 1:
        raise _fail(f"{where}: choices", f"a single-choice question has {n_right} correct",
                    "mark exactly one choice correct (or make it kind 'multiple')")
    if kind == "multiple" and n_right < 1:
        raise _fail(f"{where}: choices", "no choice is correct", "mark at least one correct")
    return Question(qid, kind, prompt, explanation, choices=tuple(choices), source=source)


def parse_quiz(d: Any, where: str = "quiz") -> Quiz:
    if not isinstance(d, dict) or set(d) != {"chapter", "title", "questions"}:
        raise _fail(where, "needs exactly the keys chapter, title, questions",
                    'write {"chapter": "01", "title": ..., "questions": [...]}')
    chapter, title = _text(d, "chapter", where), _text(d, "title", where)
    qs = d["questions"]
    if not isinstance(qs, list) or not qs:
        raise _fail(f"{where}: questions", "must be a non-empty list", "add questions")
    questions = tuple(parse_question(q, f"{where}: question {i}") for i, q in enumerate(qs))
    ids = [q.id for q in questions]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _fail(f"{where}: questions", f"ids {dup} appear more than once", "make ids unique")
    return Quiz(chapter, title, questions)


def load_quiz(path: str | Path) -> Quiz:
    """Read and check one quiz file, open or sealed (:mod:`workbench.quiz.seal`). Raises
    QuizSchemaError (SealError for a seal that does not open) saying what is wrong and where."""
    path = Path(path)
    try:
        data = open_quiz(json.loads(path.read_text(encoding="utf-8")), str(path))
    except FileNotFoundError as err:
        raise _fail(f"quiz file {path}", "does not exist",
                    "check the path (chapters load theirs by name: load_chapter_quiz)") from err
    except json.JSONDecodeError as err:
        raise _fail(f"quiz file {path}", f"is not valid JSON ({err})", "fix the JSON") from err
    return parse_quiz(data, where=str(path))
