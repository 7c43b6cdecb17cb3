"""The chapters' quizzes, shipped inside the package and loaded by chapter name.

The answer keys live here, in ``workbench/quiz/data/*.json``, not beside the notebooks: a learner's
JupyterLab file browser is rooted at ``chapters/``, and a key one click away is no self-test.
"""

from __future__ import annotations

import re
from importlib import resources

from workbench.errors import NotFoundError
from workbench.quiz.schema import Quiz, QuizSchemaError, load_quiz

# A chapter name is its notebook's stem, e.g. "02_elastic_memory".
_NAME = re.compile(r"[0-9]{2}_[a-z0-9_]+")


def _data_dir():
    return resources.files("workbench.quiz") / "data"


def quiz_names() -> list[str]:
    """Every packaged quiz, by chapter name, in chapter order."""
    return sorted(p.name[:-5] for p in _data_dir().iterdir() if p.name.endswith(".json"))


def load_chapter_quiz(name: str) -> Quiz:
    """Load and check the quiz of chapter ``name`` (the notebook's stem, e.g.
    "02_elastic_memory"). Raises NotFoundError for a name with no packaged quiz."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise NotFoundError(f"quiz {name!r}", "a quiz is named by its chapter, not by a path",
                            'call show_quiz("02_elastic_memory") with the notebook\'s name')
    entry = _data_dir() / f"{name}.json"
    if not entry.is_file():
        raise NotFoundError(f"quiz {name!r}", "no packaged quiz has that name",
                            f"use one of {', '.join(quiz_names())}")
    with resources.as_file(entry) as path:
        quiz = load_quiz(path)
    if quiz.chapter != name[:2]:
        raise QuizSchemaError(f"quiz {name!r}: chapter", f"is {quiz.chapter!r}",
                              f"set chapter to {name[:2]!r}, the file name's number")
    return quiz
