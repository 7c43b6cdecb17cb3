"""Quizzes a learner cannot game: no key beside the notebooks, no length tell, a per-learner
choice order graded back correctly, no empty attempts, and the first attempt's score kept."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")
from hypothesis import given
from hypothesis import strategies as st

from workbench.quiz import (
    ChoiceOrder,
    EmptyAnswerError,
    Scorebook,
    learner_token,
    load_chapter_quiz,
    parse_number,
    quiz_names,
)
from workbench.quiz.learner import LEARNER_ENV, learner_token_path

from .nbrun import CHAPTERS
from .quizfair import (
    answer_key_holders,
    assert_even_lengths,
    assert_grading_maps_back,
    assert_no_choice_contains_another,
    assert_no_length_tell,
    assert_right_choice_in_every_position,
)

QUIZZES = [load_chapter_quiz(n) for n in quiz_names()]
QUESTIONS = [q for quiz in QUIZZES for q in quiz.questions]
CHOICE_QS = [q for q in QUESTIONS if q.kind != "numeric"]
SINGLES = [q for q in QUESTIONS if q.kind == "single"]


# -- the key is not one click from the notebook ------------------------------------------------
def test_no_file_under_chapters_holds_an_answer_key():
    assert answer_key_holders(CHAPTERS) == []  # no key, no quiz data of any shape beside them


# -- no length tell ----------------------------------------------------------------------------
def test_right_choice_is_the_longest_about_as_often_as_chance():
    assert_no_length_tell(SINGLES)


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_right_choices_are_as_long_as_the_distractors(q):
    assert_even_lengths(q)


@pytest.mark.parametrize("q", CHOICE_QS, ids=lambda q: q.id)
def test_no_choice_text_contains_another(q):
    assert_no_choice_contains_another(q)


# -- a per-learner order, graded back to the quiz file's choices --------------------------------
def test_order_is_a_stable_permutation_per_learner():
    for q in CHOICE_QS:
        a = ChoiceOrder.for_learner(q, "learner-a")
        assert sorted(a.order) == list(range(len(q.choices)))
        assert ChoiceOrder.for_learner(q, "learner-a") == a
    orders_a = [ChoiceOrder.for_learner(q, "learner-a").order for q in CHOICE_QS]
    orders_b = [ChoiceOrder.for_learner(q, "learner-b").order for q in CHOICE_QS]
    assert orders_a != orders_b


@pytest.mark.parametrize("q", SINGLES, ids=lambda q: q.id)
def test_right_choice_lands_in_every_position(q):
    assert_right_choice_in_every_position(q)


@given(st.text(min_size=1, max_size=40), st.sampled_from(CHOICE_QS), st.data())
def test_grading_maps_display_positions_back(token, q, data):
    assert_grading_maps_back(q, token, data)


def test_widget_shows_the_learners_order_and_grades_the_shown_choice(no_score_file):
    from workbench.quiz import QuizWidget

    quiz = load_chapter_quiz("02_elastic_memory")
    qw = QuizWidget(quiz, token="learner-a")
    for card in qw.cards:
        order = ChoiceOrder.for_learner(card.q, "learner-a").order
        if card.q.kind == "single":
            assert card.input.options == tuple((card.q.choices[i].text, j)
                                               for j, i in enumerate(order))
        elif card.q.kind == "multiple":
            assert [b.description for b in card.boxes] == [card.q.choices[i].text
                                                           for i in order]
    card = qw.cards[0]
    last = len(card.q.choices) - 1
    card.select(last)
    g = card.check()
    shown = card.q.choices[ChoiceOrder.for_learner(card.q, "learner-a").order[last]]
    assert g.correct == shown.correct and g.feedback == (shown.feedback,)


def test_static_text_lists_choices_in_the_learners_order():
    from workbench.quiz.widget import quiz_text

    quiz = load_chapter_quiz("03_prefix_ownership")
    q = quiz.questions[0]
    order = ChoiceOrder.for_learner(q, "learner-a").order
    lines = quiz_text(quiz, "learner-a").splitlines()
    start = lines.index(f"Q1. {q.prompt}") + 1
    assert lines[start:start + len(order)] == [f"   [{chr(97 + j)}] {q.choices[i].text}"
                                               for j, i in enumerate(order)]


# -- the learner token -------------------------------------------------------------------------
def test_learner_token_is_stored_once_and_reused(monkeypatch, tmp_path):
    monkeypatch.delenv(LEARNER_ENV, raising=False)
    monkeypatch.setenv("WORKBENCH_SCORES", str(tmp_path / "wb" / "scores.json"))
    assert learner_token_path() == tmp_path / "wb" / "learner"
    token = learner_token()
    assert len(token) == 32 and (tmp_path / "wb" / "learner").read_text().strip() == token
    assert learner_token() == token  # the next kernel reads the same token back
    assert sorted(p.name for p in (tmp_path / "wb").iterdir()) == ["learner"]
    monkeypatch.setenv(LEARNER_ENV, "ada")
    assert learner_token() == "ada"


def test_learner_token_without_a_home_lives_for_the_process(monkeypatch, tmp_path):
    monkeypatch.delenv(LEARNER_ENV, raising=False)
    monkeypatch.setenv("WORKBENCH_SCORES", "")
    assert learner_token_path() is None and learner_token() == learner_token()
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the directory should be: nothing can be stored
    monkeypatch.setenv("WORKBENCH_SCORES", str(blocked / "scores.json"))
    assert learner_token() == learner_token() and len(learner_token()) == 32


# -- an empty Check is refused and not counted -------------------------------------------------
def test_empty_checks_are_refused_and_not_counted(no_score_file):
    from workbench.quiz import QuizWidget

    qw = QuizWidget(load_chapter_quiz("01_block_token_page"), token="learner-a")
    for card in qw.cards:
        card.select({"single": None, "multiple": [], "numeric": ""}[card.q.kind])
        assert card.check() is None
        want = "a blank field is not 0" if card.q.kind == "numeric" else "nothing is ticked"
        assert want in card.feedback.value and "Not counted as an attempt" in card.feedback.value
        assert "Why:" not in card.feedback.value  # no explanation without an attempt
    numeric = next(c for c in qw.cards if c.q.kind == "numeric")
    numeric.select("sixty-four")
    assert numeric.check() is None and "is not a finite number" in numeric.feedback.value
    assert qw.book.attempts == {} and qw.book.first == {} and qw.book.score == 0


@pytest.mark.parametrize("text, number", [("", None), ("   ", None), ("64", 64.0),
                                          (" 0 ", 0.0), ("1_024", 1024.0), ("0.5", 0.5)])
def test_parse_number(text, number):
    assert parse_number(text) == number


@pytest.mark.parametrize("text", ["abc", "nan", "inf", "-inf", "6 4"])
def test_parse_number_refuses_non_numbers(text):
    with pytest.raises(ValueError, match="is not a finite number"):
        parse_number(text)


# -- the first attempt's score is kept ---------------------------------------------------------
def test_first_attempt_counts_and_explanation_follows_it(no_score_file):
    from workbench.quiz import QuizWidget

    qw = QuizWidget(load_chapter_quiz("04_colocation_and_limits"), token="learner-a")
    card = qw.cards[0]
    wrong = next(i for i, c in enumerate(card.q.choices) if not c.correct)
    card.select_choices(wrong)
    assert not card.check().correct
    assert "Not quite" in card.feedback.value and "Why:" in card.feedback.value
    assert "Already answered" not in card.feedback.value
    card.select_choices(next(iter(card.q.correct_indices)))
    assert card.check().correct  # the retry is graded for the learner ...
    assert "Already answered, first score kept: 0 / 1" in card.feedback.value
    assert qw.book.score == 0 and qw.book.attempts == {card.q.id: 2}  # ... and not counted
    assert qw.score.value.startswith("<b>Score 0 / ")


SINGLES_04 = [q for q in load_chapter_quiz("04_colocation_and_limits").questions
              if q.kind == "single"]


@given(st.lists(st.tuples(st.sampled_from(SINGLES_04), st.one_of(st.none(), st.integers(0, 3))),
                max_size=30))
def test_score_is_the_sum_of_first_non_empty_attempts(answers):
    book = Scorebook(load_chapter_quiz("04_colocation_and_limits"))
    first: dict[str, float] = {}
    tries: dict[str, int] = {}
    for q, r in answers:
        if r is None:
            with pytest.raises(EmptyAnswerError):
                book.answer(q.id, r)
            continue
        g = book.answer(q.id, r)
        assert g.correct == q.choices[r].correct
        first.setdefault(q.id, g.score)
        tries[q.id] = tries.get(q.id, 0) + 1
    assert book.first == first and book.attempts == tries and book.score == sum(first.values())


def test_first_score_survives_a_kernel_restart(monkeypatch, tmp_path):
    from workbench.quiz import QuizWidget

    path = tmp_path / "scores.json"
    quiz = load_chapter_quiz("03_prefix_ownership")
    q = quiz.questions[0]
    wrong = next(i for i, c in enumerate(q.choices) if not c.correct)
    Scorebook(quiz, path=path).answer(q.id, wrong)
    again = Scorebook(quiz, path=path)  # a new kernel reads the record back
    assert again.first == {q.id: 0.0} and again.attempts == {q.id: 1}
    again.answer(q.id, next(iter(q.correct_indices)))
    assert again.score == 0 and json.loads(path.read_text())["03"]["attempts"] == {q.id: 2}
    monkeypatch.setenv("WORKBENCH_SCORES", str(path))
    card = QuizWidget(quiz, token="learner-a").cards[0]
    assert "Answered before: first score 0 / 1 kept" in card.feedback.value


def test_a_record_of_removed_questions_is_ignored(tmp_path):
    path = tmp_path / "scores.json"
    quiz = load_chapter_quiz("00_start_here")
    path.write_text(json.dumps({"00": {"first": {"gone": 1.0, quiz.questions[0].id: True,
                                                 quiz.questions[1].id: 1},
                                       "attempts": "garbled"}}))
    book = Scorebook(quiz, path=path)
    assert book.first == {quiz.questions[1].id: 1.0} and book.attempts == {}
