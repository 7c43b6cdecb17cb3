"""Pure-Python grading: an answer in, a :class:`Grade` out; a :class:`Scorebook` keeps the score.

Scores: a single-choice or numeric answer scores 1 or 0. A multiple-choice answer scores 1 when it
picks exactly the correct set, else ``max(0, (right picks - wrong picks) / number correct)``, so
ticking every box earns nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from workbench.errors import ConfigError
from workbench.quiz.schema import Question, Quiz


class Grade(NamedTuple):
    correct: bool
    score: float  # 0..1
    feedback: tuple[str, ...]  # one line per chosen (or missed) choice, or the numeric verdict
    explanation: str


def grade(q: Question, response: int | Iterable[int] | float) -> Grade:
    """Grade ``response``: a choice index (single), indices (multiple) or a number (numeric).
    Raises ConfigError (a ValueError) for a response of the wrong shape (the widget never
    sends one)."""
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
        return Grade(False, score, tuple(notes) or ("Pick at least one choice.",), q.explanation)
    if isinstance(response, bool) or not isinstance(response, (int, float)):
        raise ConfigError(f"quiz {q.id}: response {response!r}",
                          "a numeric question takes a number", "answer with an int or float")
    assert q.answer is not None and q.feedback is not None
    diff = float(response) - q.answer
    if abs(diff) <= q.tolerance + 1e-12 * max(1.0, abs(q.answer)):
        return Grade(True, 1.0, (q.feedback["correct"],), q.explanation)
    return Grade(False, 0.0, (q.feedback["low" if diff < 0 else "high"],), q.explanation)


def default_scores_path() -> Path | None:
    """Where scores are kept: ``$WORKBENCH_SCORES`` ("" = keep them in memory only), else
    ``~/.workbench/scores.json``."""
    env = os.environ.get("WORKBENCH_SCORES")
    if env is not None:
        return Path(env) if env else None
    return Path.home() / ".workbench" / "scores.json"


@dataclass(slots=True)
class Scorebook:
    """The learner's record for one quiz: attempts and best score per question."""

    quiz: Quiz
    path: Path | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    best: dict[str, float] = field(default_factory=dict)
    last: dict[str, bool] = field(default_factory=dict)

    def record(self, qid: str, g: Grade) -> None:
        self.quiz.question(qid)  # KeyError for a question not in this quiz
        self.attempts[qid] = self.attempts.get(qid, 0) + 1
        self.best[qid] = max(self.best.get(qid, 0.0), g.score)
        self.last[qid] = g.correct
        if self.path is not None:
            self.save()

    def answer(self, qid: str, response: int | Iterable[int] | float) -> Grade:
        g = grade(self.quiz.question(qid), response)
        self.record(qid, g)
        return g

    @property
    def score(self) -> float:
        return sum(self.best.values())

    @property
    def max_score(self) -> int:
        return len(self.quiz.questions)

    @property
    def answered(self) -> int:
        return len(self.attempts)

    def summary(self) -> str:
        return (f"Score {self.score:g} / {self.max_score} "
                f"({self.answered} of {self.max_score} answered)")

    def to_dict(self) -> dict:
        return {"title": self.quiz.title, "score": self.score, "max": self.max_score,
                "best": dict(self.best), "attempts": dict(self.attempts)}

    def save(self) -> None:
        """Merge this chapter's record into the scores file (one entry per chapter)."""
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, json.JSONDecodeError):
            data = {}  # an unreadable file is replaced rather than blocking the quiz
        data[self.quiz.chapter] = self.to_dict()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError:
            self.path = None  # read-only home: keep scoring in memory
