"""Predict first: an exercise asks for a guess in a cell, then :func:`check` compares it with
what the run gave, so the answer is read after the learner committed to one; :func:`ask` runs
a costly outcome only once the guess is there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _no_guess(what: str) -> str:
    return f"No prediction yet ({what}): write yours in the cell, then run it again."


def check(guess: Any, actual: Any, *, what: str, tolerance: float = 0.0) -> str:
    """One line: the guess against the outcome (numbers agree within ``tolerance``, anything
    else must be equal). With no guess (None) the outcome stays hidden: the line asks first."""
    if guess is None:
        return _no_guess(what)
    if isinstance(actual, bool):
        right = isinstance(guess, bool) and guess == actual  # 1 is no answer to True / False
    elif not isinstance(actual, (int, float)):
        right = guess == actual
    else:
        right = (isinstance(guess, (int, float)) and not isinstance(guess, bool)
                 and abs(guess - actual) <= tolerance)
    verdict = "right" if right else "not what the run gave"
    return f"your prediction {guess!r}, the run {actual!r}: {verdict} ({what})"


def ask(guess: Any, outcome: Callable[[], Any], *, what: str, tolerance: float = 0.0) -> str:
    """Predict first, for an exercise that costs a run: ``outcome()`` runs only once a guess is
    written, then :func:`check` compares them; with no guess yet, one line asks for it."""
    if guess is None:
        return _no_guess(what)
    return check(guess, outcome(), what=what, tolerance=tolerance)


def supported(result: Any) -> bool:
    """Whether a lab run's record says *supported* (its verdict's first word)."""
    return result.record.verdict.strip().lower().startswith("supported")


def refused(call: Callable[[], Any]) -> bool:
    """Whether ``call()`` is refused with a one-line ConfigError before anything runs."""
    from workbench.errors import ConfigError

    try:
        call()
    except ConfigError:
        return True
    return False
