"""Pure-Python grading: an answer in, a :class:`Grade` out; a :class:`Scorebook` keeps the score.

Scores: a single-choice or numeric answer scores 1 or 0. A multiple-choice answer scores 1 when it
picks exactly the correct set, else ``max(0, (right picks - wrong picks) / number correct)``, so
ticking every box earns nothing. An empty answer (nothing ticked, a blank field) is refused with
:class:`EmptyAnswerError` and is no attempt. The score kept is the first attempt's: a retry is
graded and shown, but it cannot raise (or lower) the score, so guessing until right earns nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from workbench.errors import ConfigError
from workbench.outfiles import write_text
from workbench.quiz.schema import Question, Quiz
from workbench.strictjson import read_file


class EmptyAnswerError(ConfigError):
    """A Check with nothing picked or a blank number: refused, and not counted as an attempt."""

    def __init__(self, q: Question):
        what = "nothing is ticked" if q.kind != "numeric" else "the number field is blank"
        fix = "tick a choice" if q.kind != "numeric" else "type a number"
        super().__init__(f"quiz {q.id}: no answer", what, f"{fix}, then press Check")


class Grade(NamedTuple):
    correct: bool
    score: float  # 0..1
    feedback: tuple[str, ...]  # one line per chosen (or missed) choice, or the numeric verdict
    explanation: str


def grade(q: Question, response: int | Iterable[int] | float) -> Grade:
    """Grade ``response``: a choice index (single), indices (multiple) or a number (numeric),
    all in the quiz file's order. Raises EmptyAnswerError for None or no indices, ConfigError
    (a ValueError) for a response of the wrong shape (the widget never sends one)."""
    if response is None:
        raise EmptyAnswerError(q)
    if q.kind == "single":
        if isinstance(response, bool) or not isinstance(response, int) \
                or not 0 <= response < len(q.choices):
            raise ConfigError(f"quiz {q.id}: response {response!r}",
                              "a single-choice question takes one choice index",
                              f"answer with an int in 0..{len(q.choices) - 1}")
        c = q.choices[response]
        return Grade(c.correct, float(c.correct), (c.feedback,), q.explanation)
    if q.kind == "multiple":
        if isinstance(response, (int, float, str)):
            raise ConfigError(f"quiz {q.id}: response {response!r}",
                              "a multiple-choice question takes a collection of choice indices",
                              "answer with a list of ints, e.g. [0, 2]")
        picked = set(response)
        if not picked:
            raise EmptyAnswerError(q)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(q.choices)
               for i in picked):
            raise ConfigError(f"quiz {q.id}: response {sorted(picked, key=repr)!r}",
                              "a choice index lies outside the question's choices",
                              f"use ints in 0..{len(q.choices) - 1}")
        right = q.correct_indices
        notes = [q.choices[i].feedback for i in sorted(picked)]
        notes += [f"Missed: {q.choices[i].text} - {q.choices[i].feedback}"
                  for i in sorted(right - picked)]
        if picked == right:
            return Grade(True, 1.0, tuple(notes), q.explanation)
        score = max(0.0, (len(picked & right) - len(picked - right)) / len(right))
        return Grade(False, score, tuple(notes), q.explanation)
    if isinstance(response, bool) or not isinstance(response, (int, float)):
        raise ConfigError(f"quiz {q.id}: response {response!r}",
                          "a numeric question takes a number", "answer with an int or float")
    assert q.answer is not None and q.feedback is not None
    diff = float(response) - q.answer
    if abs(diff) <= q.tolerance + 1e-12 * max(1.0, abs(q.answer)):
        return Grade(True, 1.0, (q.feedback["correct"],), q.explanation)
    return Grade(False, 0.0, (q.feedback["low" if diff < 0 else "high"],), q.explanation)


def parse_number(text: str) -> float | None:
    """A numeric field's text as a number; None for a blank field (no answer, not 0).
    Raises ConfigError for text that is not a finite number."""
    t = text.strip().replace("_", "")
    if not t:
        return None
    try:
        x = float(t)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ConfigError(f"answer {text.strip()!r}", "is not a finite number",
                          "type a plain number, e.g. 64 or 0.5")
    return x


APP_NAME = "kv-cache-workbench"  # the user data folder's name (platformdirs)
LEGACY_SCORES = Path("~/.workbench/scores.json")  # where earlier versions kept them


def default_scores_path() -> Path | None:
    """Where scores are kept: ``$WORKBENCH_SCORES`` ("" = keep them in memory only), else
    ``scores.json`` in this user's data folder (platformdirs: ``~/.local/share/kv-cache-workbench``
    on Linux, ``~/Library/Application Support/kv-cache-workbench`` on macOS); a file an earlier
    version left in ``~/.workbench`` is used where it is."""
    env = os.environ.get("WORKBENCH_SCORES")
    if env is not None:
        return Path(env) if env else None
    from platformdirs import user_data_path

    path = user_data_path(APP_NAME, appauthor=False) / "scores.json"
    legacy = LEGACY_SCORES.expanduser()
    return legacy if legacy.exists() and not path.exists() else path


def _read_scores(path: Path) -> dict:
    try:
        data = read_file(path, "scores file", "") if path.exists() else {}
    except ConfigError:
        return {}  # an unreadable file is replaced rather than blocking the quiz
    return data if isinstance(data, dict) else {}


@dataclass(slots=True)
class Scorebook:
    """The learner's record for one quiz: the first attempt's score and the attempt count per
    question. With a ``path``, the record of earlier kernels is read back on creation, so a
    kernel restart does not grant a new first attempt."""

    quiz: Quiz
    path: Path | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.path is not None and not self.first:
            self._load(_read_scores(self.path).get(self.quiz.chapter))

    def _load(self, entry: object) -> None:
        if not isinstance(entry, dict):
            return
        ids = {q.id for q in self.quiz.questions}  # drop questions a newer quiz no longer has
        for key, into, kind in (("first", self.first, float), ("attempts", self.attempts, int)):
            saved = entry.get(key)
            for qid, v in (saved.items() if isinstance(saved, dict) else ()):
                if qid in ids and isinstance(v, (int, float)) and not isinstance(v, bool):
                    into[qid] = kind(v)

    def is_answered(self, qid: str) -> bool:
        """True once a first (graded) attempt is recorded for ``qid``."""
        return qid in self.first

    def record(self, qid: str, g: Grade) -> None:
        self.quiz.question(qid)  # NotFoundError for a question not in this quiz
        self.attempts[qid] = self.attempts.get(qid, 0) + 1
        self.first.setdefault(qid, g.score)  # a retry never changes the kept score
        self.last[qid] = g.correct
        if self.path is not None:
            self.save()

    def answer(self, qid: str, response: int | Iterable[int] | float | None) -> Grade:
        """Grade and record ``response`` (quiz-file indices). An empty response raises
        EmptyAnswerError before anything is recorded."""
        g = grade(self.quiz.question(qid), response)
        self.record(qid, g)
        return g

    @property
    def score(self) -> float:
        return sum(self.first.values())

    @property
    def max_score(self) -> int:
        return len(self.quiz.questions)

    @property
    def answered(self) -> int:
        return len(self.first)

    def summary(self) -> str:
        return (f"Score {self.score:g} / {self.max_score} "
                f"({self.answered} of {self.max_score} answered; first attempts count)")

    def to_dict(self) -> dict:
        return {"title": self.quiz.title, "score": self.score, "max": self.max_score,
                "first": dict(self.first), "attempts": dict(self.attempts)}

    def save(self) -> None:
        """Merge this chapter's record into the scores file (one entry per chapter)."""
        assert self.path is not None
        data = _read_scores(self.path)
        data[self.quiz.chapter] = self.to_dict()
        try:
            write_text(self.path, json.dumps(data, indent=1, sort_keys=True), "scores file")
        except ConfigError:
            self.path = None  # read-only home: keep scoring in memory
