"""The lab notebooks' quizzes, shipped with the package (``workbench/quiz/labdata/*.json``),
loaded by the lab notebook's name and graded by the chapters' machinery.

A lab quiz file has the chapters' schema; its ``chapter`` field is ``"lab NN"`` so its scores
never mix with chapter NN's in the scores file.
"""

from __future__ import annotations

from workbench.quiz.bank import load_packaged, packaged
from workbench.quiz.schema import Quiz


def lab_quiz_names() -> list[str]:
    """Every packaged lab quiz, by notebook name (e.g. "00_colocation"), in lab order."""
    return packaged("labdata")


def load_lab_quiz(name: str) -> Quiz:
    """Load and check the quiz of lab notebook ``name`` (its stem, e.g. "00_colocation")."""
    return load_packaged("labdata", name, f"lab {name[:2]}" if isinstance(name, str) else "",
                         "lab quiz", "show_lab_quiz", "lab notebook")


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
