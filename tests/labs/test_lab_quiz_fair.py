"""The lab quizzes meet the chapters' fairness checks (the same ones, tests/chapters/quizfair.py):
no key beside the notebooks, no length tell, the right choice in every position over learners, a
per-learner order graded back correctly, and scores kept apart from the chapters'."""

from __future__ import annotations

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")
from hypothesis import given
from hypothesis import strategies as st

from tests.chapters.quizfair import (
    answer_key_holders,
    assert_even_lengths,
    assert_grading_maps_back,
    assert_no_choice_contains_another,
    assert_no_length_tell,
    assert_right_choice_in_every_position,
)
from workbench.quiz import Scorebook, quiz_names
from workbench.quiz.labbank import lab_quiz_names, load_lab_quiz

from .test_lab_notebooks import ROOT

LABS = ROOT / "labs"
QUIZZES = [load_lab_quiz(n) for n in lab_quiz_names()]
QUESTIONS = [q for quiz in QUIZZES for q in quiz.questions]
CHOICE_QS = [q for q in QUESTIONS if q.kind != "numeric"]
SINGLES = [q for q in QUESTIONS if q.kind == "single"]


def test_no_file_under_labs_holds_an_answer_key():
    assert answer_key_holders(LABS) == []


def test_lab_quiz_ids_are_unique_and_apart_from_the_chapters():
    ids = [q.id for q in QUESTIONS]
    assert len(ids) == len(set(ids))
    chapters = {name[:2] for name in quiz_names()}
    assert all(quiz.chapter.startswith("lab ") and quiz.chapter not in chapters
               for quiz in QUIZZES)  # the scores file keys a record by this field


def test_right_choice_is_the_longest_about_as_often_as_chance():
    assert_no_length_tell(SINGLES)


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_right_choices_are_as_long_as_the_distractors(q):
    assert_even_lengths(q)


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_no_choice_text_contains_another(q):
    assert_no_choice_contains_another(q)


@pytest.mark.parametrize("q", SINGLES, ids=lambda q: q.id)
def test_right_choice_lands_in_every_position(q):
    assert_right_choice_in_every_position(q)


@given(st.text(min_size=1, max_size=40), st.sampled_from(CHOICE_QS), st.data())
def test_grading_maps_display_positions_back(token, q, data):
    assert_grading_maps_back(q, token, data)


def test_widget_grades_the_shown_choice_and_keeps_the_first_score(tmp_path, monkeypatch):
    from workbench.quiz import QuizWidget

    monkeypatch.setenv("WORKBENCH_SCORES", "")
    quiz = QUIZZES[0]
    qw = QuizWidget(quiz, book=Scorebook(quiz, path=tmp_path / "scores.json"), token="a")
    card = qw.cards[0]
    wrong = next(i for i, c in enumerate(card.q.choices) if not c.correct)
    card.select_choices(wrong)
    assert not card.check().correct
    card.select_choices(next(iter(card.q.correct_indices)))
    assert card.check().correct and qw.book.score == 0  # the retry is not counted
    assert "Already answered, first score kept: 0 / 1" in card.feedback.value


def test_lab_quiz_refuses_a_path_or_an_unknown_name():
    from workbench.errors import NotFoundError

    for bad in ("../chapters/00_start_here", "99_nothing", "colocation"):
        with pytest.raises(NotFoundError):
            load_lab_quiz(bad)
