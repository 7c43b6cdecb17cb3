"""The lab notebooks' quizzes, shipped with the package (``workbench/quiz/labdata/*.json``),
loaded by the lab notebook's name and graded by the chapters' machinery.

A lab quiz file has the chapters' schema; its ``chapter`` field is ``"lab NN"`` so its scores
never mix with chapter NN's in the scores file.
"""

from __future__ import annotations

import re
from importlib import resources

from workbench.errors import NotFoundError
from workbench.quiz.schema import Quiz, QuizSchemaError, load_quiz

_NAME = re.compile(r"[0-9]{2}_[a-z0-9_]+")


def _data_dir():
    return resources.files("workbench.quiz") / "labdata"


def lab_quiz_names() -> list[str]:
    """Every packaged lab quiz, by notebook name (e.g. "00_colocation"), in lab order."""
    return sorted(p.name[:-5] for p in _data_dir().iterdir() if p.name.endswith(".json"))


def load_lab_quiz(name: str) -> Quiz:
    """Load and check the quiz of lab notebook ``name`` (its stem, e.g. "00_colocation")."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise NotFoundError(f"lab quiz {name!r}", "a lab quiz is named by its notebook",
                            'call show_lab_quiz("00_colocation") with the notebook\'s name')
    entry = _data_dir() / f"{name}.json"
    if not entry.is_file():
        raise NotFoundError(f"lab quiz {name!r}", "no packaged lab quiz has that name",
                            f"use one of {', '.join(lab_quiz_names())}")
    with resources.as_file(entry) as path:
        quiz = load_quiz(path)
    if quiz.chapter != f"lab {name[:2]}":
        raise QuizSchemaError(f"lab quiz {name!r}: chapter", f"is {quiz.chapter!r}",
                              f"set chapter to 'lab {name[:2]}', from the file name")
    return quiz


def show_lab_quiz(name: str, *, live: bool | None = None):
    """Display lab ``name``'s quiz as the chapters show theirs; returns the widget (None in
    static mode, where the questions print as text)."""
    from IPython.display import display

    from workbench.quiz.learner import learner_token
    from workbench.quiz.widget import QuizWidget, quiz_text
    from workbench.viz.live import is_live

    quiz = load_lab_quiz(name)
    if not (is_live() if live is None else live):
        print(quiz_text(quiz, learner_token()))
        return None
    qw = QuizWidget(quiz)
    display(qw.box)
    return qw
