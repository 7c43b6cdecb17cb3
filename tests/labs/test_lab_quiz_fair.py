"""The lab quizzes meet the chapters' fairness checks (tests/chapters/test_quiz_fair.py): no key
beside the notebooks, no length tell, the right choice in every position over learners, a
per-learner order graded back correctly, and scores kept apart from the chapters'."""

from __future__ import annotations

from statistics import mean

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")
from hypothesis import given
from hypothesis import strategies as st

from workbench.quiz import ChoiceOrder, Scorebook, grade, quiz_names
from workbench.quiz.labbank import lab_quiz_names, load_lab_quiz

from .test_lab_notebooks import ROOT

LABS = ROOT / "labs"
QUIZZES = [load_lab_quiz(n) for n in lab_quiz_names()]
QUESTIONS = [q for quiz in QUIZZES for q in quiz.questions]
CHOICE_QS = [q for q in QUESTIONS if q.kind != "numeric"]
SINGLES = [q for q in QUESTIONS if q.kind == "single"]


def test_no_file_under_labs_holds_an_answer_key():
    holders = [p.relative_to(LABS) for p in LABS.rglob("*") if p.is_file()
               and '"correct"' in p.read_text(encoding="utf-8", errors="replace")]
    assert holders == []
    assert not list(LABS.rglob("*.json"))


def test_lab_quiz_ids_are_unique_and_apart_from_the_chapters():
    ids = [q.id for q in QUESTIONS]
    assert len(ids) == len(set(ids))
    chapters = {name[:2] for name in quiz_names()}
    assert all(quiz.chapter.startswith("lab ") and quiz.chapter not in chapters
               for quiz in QUIZZES)  # the scores file keys a record by this field


def test_right_choice_is_the_longest_about_as_often_as_chance():
    chance = sum(1 / len(q.choices) for q in SINGLES)
    band = (chance - 0.10 * len(SINGLES), chance + 0.10 * len(SINGLES))
    lengths = [[len(c.text) for c in q.choices] for q in SINGLES]
    right = [next(iter(q.correct_indices)) for q in SINGLES]
    longest = [q.id for q, n, r in zip(SINGLES, lengths, right, strict=True)
               if all(n[r] > x for i, x in enumerate(n) if i != r)]
    shortest = [q.id for q, n, r in zip(SINGLES, lengths, right, strict=True)
                if all(n[r] < x for i, x in enumerate(n) if i != r)]
    assert band[0] <= len(longest) <= band[1], f"right choice longest in {longest}"
    assert band[0] <= len(shortest) <= band[1], f"right choice shortest in {shortest}"


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_right_choices_are_as_long_as_the_distractors(q):
    right = mean(len(c.text) for c in q.choices if c.correct)
    wrong = mean(len(c.text) for c in q.choices if not c.correct)
    assert 0.75 <= right / wrong <= 1.33, (q.id, right, wrong)
    avg = mean(len(c.text) for c in q.choices)
    assert all(0.5 * avg <= len(c.text) <= 2 * avg for c in q.choices), q.id


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_no_choice_text_contains_another(q):
    texts = [c.text for c in q.choices]
    assert not [(a, b) for a in texts for b in texts if a != b and a in b]


@pytest.mark.parametrize("q", SINGLES, ids=lambda q: q.id)
def test_right_choice_lands_in_every_position(q):
    n = len(q.choices)
    right = next(iter(q.correct_indices))
    seen = [0] * n
    for k in range(400):
        seen[ChoiceOrder.for_learner(q, f"learner-{k}").to_display(right)] += 1
    assert all(400 / n * 0.6 <= s <= 400 / n * 1.4 for s in seen), seen


@given(st.text(min_size=1, max_size=40), st.sampled_from(CHOICE_QS), st.data())
def test_grading_maps_display_positions_back(token, q, data):
    order = ChoiceOrder.for_learner(q, token)
    shown = [q.choices[i] for i in order.order]
    if q.kind == "single":
        pos = data.draw(st.integers(0, len(shown) - 1))
        g = grade(q, order.to_original(pos))
        assert g.correct == shown[pos].correct and g.feedback == (shown[pos].feedback,)
    else:
        picked = data.draw(st.sets(st.integers(0, len(shown) - 1), min_size=1))
        g = grade(q, order.to_original(picked))
        assert g.correct == ({j for j, c in enumerate(shown) if c.correct} == picked)


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
