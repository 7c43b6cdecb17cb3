"""Self-test quizzes shipped as package data (``workbench/quiz/data``), graded in the kernel."""

from __future__ import annotations

from workbench.quiz.bank import load_chapter_quiz, quiz_names
from workbench.quiz.grader import (
    EmptyAnswerError,
    Grade,
    Scorebook,
    default_scores_path,
    grade,
    parse_number,
)
from workbench.quiz.learner import ChoiceOrder, learner_token
from workbench.quiz.schema import Choice, Question, Quiz, QuizSchemaError, load_quiz, parse_quiz

__all__ = ["ChoiceOrder", "Choice", "EmptyAnswerError", "Grade", "Question", "Quiz",
           "QuizSchemaError", "QuizWidget", "Scorebook", "default_scores_path", "grade",
           "learner_token", "load_chapter_quiz", "load_quiz", "parse_number", "parse_quiz",
           "quiz_names", "show_quiz"]


def __getattr__(name: str):
    # The widget pulls in ipywidgets: import it only when a notebook asks for it.
    if name in ("QuizWidget", "show_quiz"):
        from workbench.quiz import widget

        return getattr(widget, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")  # the module protocol
