"""The fairness checks shared by the chapter quizzes (tests/chapters/test_quiz_fair.py) and the
lab quizzes (tests/labs/test_lab_quiz_fair.py): one definition of "a learner cannot game it"."""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from workbench.quiz import ChoiceOrder, grade
from workbench.quiz.schema import Question


def answer_key_holders(folder: Path) -> list[Path]:
    """Files under ``folder`` (a notebook's own folder) that hold a quiz key or quiz data."""
    holders = [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()
               and '"correct"' in p.read_text(encoding="utf-8", errors="replace")]
    return holders + [p.relative_to(folder) for p in folder.rglob("*.json")]


def assert_no_length_tell(singles: list[Question]) -> None:
    """Across all single-choice questions the right choice is the strictly longest (and the
    strictly shortest) within 10 points of the questions of the chance rate: more would make
    "pick the longest" pay, fewer would make "never pick an extreme" pay."""
    chance = sum(1 / len(q.choices) for q in singles)
    band = (chance - 0.10 * len(singles), chance + 0.10 * len(singles))
    lengths = [[len(c.text) for c in q.choices] for q in singles]
    right = [next(iter(q.correct_indices)) for q in singles]
    longest = [q.id for q, n, r in zip(singles, lengths, right, strict=True)
               if all(n[r] > x for i, x in enumerate(n) if i != r)]
    shortest = [q.id for q, n, r in zip(singles, lengths, right, strict=True)
                if all(n[r] < x for i, x in enumerate(n) if i != r)]
    assert band[0] <= len(longest) <= band[1], f"right choice longest in {longest}"
    assert band[0] <= len(shortest) <= band[1], f"right choice shortest in {shortest}"


def assert_even_lengths(q: Question) -> None:
    """The right choices' mean length lies within 0.75x..1.33x of the distractors' mean, and
    no choice is under half or over twice the question's mean length."""
    right = mean(len(c.text) for c in q.choices if c.correct)
    wrong = mean(len(c.text) for c in q.choices if not c.correct)
    assert 0.75 <= right / wrong <= 1.33, (q.id, right, wrong)
    avg = mean(len(c.text) for c in q.choices)
    assert all(0.5 * avg <= len(c.text) <= 2 * avg for c in q.choices), q.id


def assert_no_choice_contains_another(q: Question) -> None:
    """A browser finds a choice by its text: no choice may be a substring of another."""
    texts = [c.text for c in q.choices]
    assert not [(a, b) for a in texts for b in texts if a != b and a in b]


def assert_right_choice_in_every_position(q: Question, learners: int = 400) -> None:
    """Over ``learners`` learners the right choice shows at each position about equally often."""
    n = len(q.choices)
    right = next(iter(q.correct_indices))
    seen = [0] * n
    for k in range(learners):
        seen[ChoiceOrder.for_learner(q, f"learner-{k}").to_display(right)] += 1
    assert all(learners / n * 0.6 <= s <= learners / n * 1.4 for s in seen), seen


def assert_grading_maps_back(q: Question, token: str, data) -> None:
    """A pick at a display position is graded as the quiz file's choice shown there
    (``data``: hypothesis's ``st.data()``)."""
    from hypothesis import strategies as st

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
