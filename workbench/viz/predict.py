"""Predict first: an exercise asks for a guess in a cell, then :func:`check` compares it with
what the run gave, so the answer is read after the learner committed to one."""

from __future__ import annotations

from typing import Any

NO_GUESS = ("(no prediction written: put yours in the cell above and run it again to have it "
            "checked) ")


def check(guess: Any, actual: Any, *, what: str, tolerance: float = 0.0) -> str:
    """One line: the guess against the outcome (numbers agree within ``tolerance``, anything
    else must be equal). A guess of None says so and shows the outcome anyway (a headless run
    has no learner to ask)."""
    if guess is None:
        return f"{NO_GUESS}{what}: {actual!r}"
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        right = guess == actual
    else:
        right = isinstance(guess, (int, float)) and abs(guess - actual) <= tolerance
    verdict = "right" if right else "not what the run gave"
    return f"your prediction {guess!r}, the run {actual!r}: {verdict} ({what})"
