"""The chapters' quizzes, shipped inside the package and loaded by chapter name.

The questions live in ``workbench/quiz/data/*.json``, sealed (:mod:`workbench.quiz.seal`):
JupyterLab serves the whole repository, so a readable key would be one click from the notebook.
"""

from __future__ import annotations

import re
from importlib import resources

from workbench.errors import NotFoundError
from workbench.quiz.schema import Quiz, QuizSchemaError, load_quiz

# A chapter name is its notebook's stem, e.g. "02_elastic_memory".
_NAME = re.compile(r"[0-9]{2}_[a-z0-9_]+")


def _data_dir(folder: str = "data"):
    return resources.files("workbench.quiz") / folder


def packaged(folder: str) -> list[str]:
    """Every quiz file in package folder ``folder``, by notebook name, in notebook order."""
    return sorted(p.name[:-5] for p in _data_dir(folder).iterdir() if p.name.endswith(".json"))


def load_packaged(folder: str, name: str, chapter: str, what: str, show: str,
                  by: str) -> Quiz:
    """Load and check quiz ``name`` (a notebook's stem) of package folder ``folder``; its
    ``chapter`` field must be ``chapter``. ``what`` names it in errors, ``show`` is the call that
    displays it, ``by`` what names one ("chapter"). Raises NotFoundError for a name with no
    packaged quiz."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise NotFoundError(f"{what} {name!r}", f"a {what} is named by its {by}, not by a path",
                            f'call {show}("{packaged(folder)[0]}") with the notebook\'s name')
    entry = _data_dir(folder) / f"{name}.json"
    if not entry.is_file():
        raise NotFoundError(f"{what} {name!r}", f"no packaged {what} has that name",
                            f"use one of {', '.join(packaged(folder))}")
    with resources.as_file(entry) as path:
        quiz = load_quiz(path)
    if quiz.chapter != chapter:
        raise QuizSchemaError(f"{what} {name!r}: chapter", f"is {quiz.chapter!r}",
                              f"set chapter to {chapter!r}, from the file name's number")
    return quiz


def quiz_names() -> list[str]:
    """Every packaged chapter quiz, by chapter name, in chapter order."""
    return packaged("data")


def load_chapter_quiz(name: str) -> Quiz:
    """Load and check the quiz of chapter ``name`` (the notebook's stem, e.g.
    "02_elastic_memory")."""
    return load_packaged("data", name, name[:2] if isinstance(name, str) else "", "quiz",
                         "show_quiz", "chapter")
