"""Self-test quizzes stored as data beside each chapter, graded in the kernel."""

from __future__ import annotations

from workbench.quiz.grader import Grade, Scorebook, default_scores_path, grade
from workbench.quiz.schema import Choice, Question, Quiz, QuizSchemaError, load_quiz, parse_quiz

__all__ = ["Choice", "Grade", "Question", "Quiz", "QuizSchemaError", "QuizWidget", "Scorebook",
           "default_scores_path", "grade", "load_quiz", "parse_quiz", "show_quiz"]


def __getattr__(name: str):
    # The widget pulls in ipywidgets: import it only when a notebook asks for it.
    if name in ("QuizWidget", "show_quiz"):
        from workbench.quiz import widget

        return getattr(widget, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")  # the module protocol
