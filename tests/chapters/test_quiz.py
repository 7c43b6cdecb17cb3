"""Quiz data, schema and grading: every chapter's questions load, and grading is exact."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("nbformat", reason="the notebook stack is not installed (make setup)")
from hypothesis import given
from hypothesis import strategies as st

from workbench.errors import ConfigError, NotFoundError
from workbench.quiz import (
    EmptyAnswerError,
    QuizSchemaError,
    Scorebook,
    grade,
    load_chapter_quiz,
    load_quiz,
    parse_quiz,
    quiz_names,
)
from workbench.quiz.schema import parse_question

from .nbrun import NOTEBOOKS, QUIZZES

SEED_13 = "seed 001 §13"


def _single(**kw):
    q = {"id": "q", "kind": "single", "prompt": "p?", "explanation": "e",
         "choices": [{"text": "a", "correct": True, "feedback": "fa"},
                     {"text": "b", "correct": False, "feedback": "fb"},
                     {"text": "c", "correct": False, "feedback": "fc"}]}
    q.update(kw)
    return q


def _numeric(**kw):
    q = {"id": "n", "kind": "numeric", "prompt": "how many?", "explanation": "e",
         "answer": 64, "tolerance": 0.5, "unit": "blocks",
         "feedback": {"correct": "yes", "low": "too low", "high": "too high"}}
    q.update(kw)
    return q


# -- the chapters' quiz files ------------------------------------------------------------------
def test_every_chapter_has_a_quiz_file():
    assert [p.stem for p in QUIZZES] == [p.stem for p in NOTEBOOKS] == quiz_names()


def test_chapter_quiz_loads_by_name_only():
    assert load_chapter_quiz("02_elastic_memory") == load_quiz(QUIZZES[2])
    with pytest.raises(NotFoundError, match="named by its chapter, not by a path"):
        load_chapter_quiz("quizzes/02_elastic_memory.json")
    with pytest.raises(NotFoundError, match="use one of 00_start_here, 01_block_token_page"):
        load_chapter_quiz("99_no_such_chapter")


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_quiz_file_loads_and_has_enough_own_questions(path):
    quiz = load_chapter_quiz(path.stem)
    assert quiz.chapter == path.stem[:2]
    own = [q for q in quiz.questions if q.source != SEED_13]
    assert len(own) >= 4, f"{path.name}: only {len(own)} questions of our own"
    for q in quiz.questions:
        if q.kind != "numeric":
            assert len({c.feedback for c in q.choices}) == len(q.choices)  # no copy-paste
            assert not all(c.correct for c in q.choices)


def test_all_ten_self_test_questions_are_covered():
    seed = [q for p in QUIZZES for q in load_quiz(p).questions if q.source == SEED_13]
    assert len(seed) == 10
    assert len({q.id for q in seed}) == 10


def test_question_ids_unique_across_chapters():
    ids = [q.id for p in QUIZZES for q in load_quiz(p).questions]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("path", QUIZZES, ids=lambda p: p.stem)
def test_correct_answers_grade_correct(path):
    quiz = load_quiz(path)
    book = Scorebook(quiz)
    for q in quiz.questions:
        if q.kind == "single":
            g = book.answer(q.id, next(iter(q.correct_indices)))
        elif q.kind == "multiple":
            g = book.answer(q.id, sorted(q.correct_indices))
        else:
            g = book.answer(q.id, q.answer)
        assert g.correct and g.score == 1.0 and g.feedback and g.explanation
    assert book.score == book.max_score == len(quiz)


# -- schema ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, why", [
    (_single(kind="essay"), "kind"),
    (_single(prompt=""), "prompt"),
    (_single(explanation=" "), "explanation"),
    (_single(choices=[{"text": "a", "correct": True, "feedback": "f"}]), "at least 2"),
    (_single(choices=[{"text": "a", "correct": True, "feedback": "f"},
                      {"text": "b", "correct": True, "feedback": "g"}]), "2 correct"),
    (_single(choices=[{"text": "a", "correct": True, "feedback": ""},
                      {"text": "b", "correct": False, "feedback": "g"}]), "feedback"),
    (_single(choices=[{"text": "a", "correct": True, "feedback": "f"},
                      {"text": "a", "correct": False, "feedback": "g"}]), "same text"),
    (_single(choices=[{"text": "a", "correct": 1, "feedback": "f"},
                      {"text": "b", "correct": False, "feedback": "g"}]), "true or false"),
    (_single(extra=1), "unknown keys"),
    (_single(answer=3), "no 'answer'"),
    (_single(kind="multiple", choices=[{"text": "a", "correct": False, "feedback": "f"},
                                       {"text": "b", "correct": False, "feedback": "g"}]),
     "no choice is correct"),
    (_numeric(tolerance=-1), "negative"),
    (_numeric(answer="64"), "finite number"),
    (_numeric(answer=float("nan")), "finite number"),
    (_numeric(feedback={"correct": "y", "low": "l"}), "feedback"),
    (_numeric(choices=[]), "no choices"),
])
def test_schema_rejects(bad, why):
    with pytest.raises(QuizSchemaError, match=why):
        parse_question(bad)


def test_quiz_level_schema():
    good = {"chapter": "09", "title": "t", "questions": [_single(), _numeric()]}
    assert len(parse_quiz(good)) == 2
    with pytest.raises(QuizSchemaError, match="more than once"):
        parse_quiz({**good, "questions": [_single(), _single()]})
    with pytest.raises(QuizSchemaError, match="non-empty list"):
        parse_quiz({**good, "questions": []})
    with pytest.raises(QuizSchemaError, match="exactly the keys"):
        parse_quiz({"title": "t", "questions": [_single()]})


def test_load_quiz_errors(tmp_path):
    with pytest.raises(QuizSchemaError, match="does not exist"):
        load_quiz(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(QuizSchemaError, match="not valid JSON"):
        load_quiz(bad)


# -- grading -----------------------------------------------------------------------------------
def test_single_choice_feedback_is_the_choice_feedback():
    q = parse_question(_single())
    assert grade(q, 0) == (True, 1.0, ("fa",), "e")
    g = grade(q, 2)
    assert not g.correct and g.score == 0 and g.feedback == ("fc",)
    for bad in (3, -1, True, "0", 1.0):  # None is an empty answer: test_empty_answer_is_refused
        with pytest.raises(ConfigError, match=r"single-choice question takes one choice index"):
            grade(q, bad)


def test_numeric_tolerance_and_direction():
    q = parse_question(_numeric())
    assert grade(q, 64.5).correct and grade(q, 63.5).correct
    assert grade(q, 63.4).feedback == ("too low",)
    assert grade(q, 64.6).feedback == ("too high",)
    with pytest.raises(ConfigError, match="a numeric question takes a number"):
        grade(q, "64")


MULTI = parse_question(_single(kind="multiple", choices=[
    {"text": t, "correct": c, "feedback": f"f{t}"}
    for t, c in (("a", True), ("b", True), ("c", False), ("d", False), ("e", True))]))


@given(st.sets(st.integers(0, 4), min_size=1))
def test_multiple_choice_score_properties(picked):
    g = grade(MULTI, picked)
    right = {0, 1, 4}
    assert 0.0 <= g.score <= 1.0
    assert g.correct == (picked == right) == (g.score == 1.0)
    assert g.score == max(0.0, (len(picked & right) - len(picked - right)) / 3) or g.correct
    # every chosen choice and every missed correct one gets a feedback line
    assert len(g.feedback) == len(picked) + len(right - picked)


@pytest.mark.parametrize("q, empty", [(MULTI, set()), (MULTI, []), (MULTI, None),
                                      (parse_question(_single()), None),
                                      (parse_question(_numeric()), None)])
def test_empty_answer_is_refused(q, empty):
    with pytest.raises(EmptyAnswerError, match=f"quiz {q.id}: no answer: .*then press Check"):
        grade(q, empty)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
       st.floats(min_value=0, max_value=100))
def test_numeric_grading_matches_tolerance(x, tol):
    q = parse_question(_numeric(tolerance=tol))
    g = grade(q, x)
    assert g.correct == (abs(x - 64) <= tol + 1e-12 * 64) or abs(abs(x - 64) - tol) < 1e-9
    if not g.correct:
        assert g.feedback == (("too low",) if x < 64 else ("too high",))


def test_scorebook_keeps_first_and_saves(tmp_path):
    quiz = parse_quiz({"chapter": "09", "title": "t", "questions": [_single(), _numeric()]})
    path = tmp_path / "scores.json"
    book = Scorebook(quiz, path=path)
    book.answer("q", 1)  # wrong first: 0 is kept
    assert book.answer("q", 0).correct  # a right retry is graded but does not count
    book.answer("q", 2)
    assert book.first == {"q": 0.0} and book.attempts == {"q": 3} and book.last == {"q": False}
    assert book.summary() == "Score 0 / 2 (1 of 2 answered; first attempts count)"
    saved = json.loads(path.read_text())
    assert saved["09"]["score"] == 0.0 and saved["09"]["attempts"] == {"q": 3}
    other = copy.deepcopy(saved)
    other["05"] = {"score": 2}
    path.write_text(json.dumps(other))
    book.answer("n", 64)
    merged = json.loads(path.read_text())
    assert merged["05"] == {"score": 2} and merged["09"]["score"] == 1.0
    with pytest.raises(NotFoundError, match="question 'nope': this quiz has no question"):
        book.answer("nope", 0)


def test_scores_path_from_env(monkeypatch, tmp_path):
    from workbench.quiz import default_scores_path

    monkeypatch.setenv("WORKBENCH_SCORES", "")
    assert default_scores_path() is None
    monkeypatch.setenv("WORKBENCH_SCORES", str(tmp_path / "s.json"))
    assert default_scores_path() == tmp_path / "s.json"


# -- the widget, driven from Python (what a click does in the browser) -------------------------
def test_quiz_widget_records_score(no_score_file):
    from workbench.quiz import QuizWidget

    quiz = load_chapter_quiz("02_elastic_memory")
    qw = QuizWidget(quiz, token="learner-a")
    card = qw.cards[0]
    assert card.check() is None and "Pick an answer first" in card.feedback.value
    right = next(iter(card.q.correct_indices))
    card.select_choices(right)
    card.button.click()
    assert "Correct" in card.feedback.value and "Why:" in card.feedback.value
    assert qw.score.value.startswith("<b>Score 1 /")
    for c in qw.cards:
        if c.q.kind == "multiple":
            c.select_choices(sorted(c.q.correct_indices))
            assert c.check().correct
        if c.q.kind == "numeric":
            c.select(c.q.answer)
            assert c.check().correct


def test_scores_live_in_the_user_data_folder_and_the_quiz_says_where(monkeypatch, tmp_path):
    from platformdirs import user_data_path

    from workbench.quiz import QuizWidget, default_scores_path

    monkeypatch.delenv("WORKBENCH_SCORES", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = default_scores_path()
    assert path == user_data_path("kv-cache-workbench", appauthor=False) / "scores.json"
    assert path == tmp_path / "data" / "kv-cache-workbench" / "scores.json"
    legacy = tmp_path / ".workbench" / "scores.json"  # an earlier version's file stays in use
    legacy.parent.mkdir()
    legacy.write_text("{}")
    assert default_scores_path() == legacy
    legacy.unlink()
    qw = QuizWidget(load_chapter_quiz("02_elastic_memory"), token="learner-a")
    assert str(path) in qw.where.value
    monkeypatch.setenv("WORKBENCH_SCORES", "")
    assert "memory only" in QuizWidget(load_chapter_quiz("02_elastic_memory"),
                                       token="learner-a").where.value
