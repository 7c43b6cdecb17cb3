"""Per-learner choice order: each learner sees a question's choices in an order of their own.

The order is drawn from a learner token, a random string kept in ``learner`` beside the scores
file (the user data folder, see ``default_scores_path``). It is stored rather than taken from the
kernel session because a session id changes with every kernel restart: the order would change
under a learner who restarts, while
their first score (kept in the scores file) stays. A stored token is stable for one user across
kernels, notebooks and days, and differs between users, so "the answer is (b)" does not carry
from one learner to another. ``$WORKBENCH_LEARNER`` overrides it (a class that assigns names, a
test). Where nothing can be stored the token lives for the process only.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import ConfigError
from workbench.quiz.grader import default_scores_path
from workbench.quiz.schema import Question

LEARNER_ENV = "WORKBENCH_LEARNER"
_PROCESS_TOKEN = secrets.token_hex(16)  # used only where no token file can be kept


def learner_token_path() -> Path | None:
    """Where the token is kept: beside the scores file; None when scores stay in memory."""
    scores = default_scores_path()
    return None if scores is None else scores.parent / "learner"


def _read(path: Path) -> str | None:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def learner_token() -> str:
    """The learner's token: ``$WORKBENCH_LEARNER``, else the stored one (created on first use),
    else one for this process."""
    env = os.environ.get(LEARNER_ENV, "").strip()
    if env:
        return env
    path = learner_token_path()
    if path is None:
        return _PROCESS_TOKEN
    token = _read(path)
    if token:
        return token
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".learner.{os.getpid()}")
        tmp.write_text(secrets.token_hex(16) + "\n", encoding="utf-8")
        try:
            os.link(tmp, path)  # atomic and never overwrites: two kernels agree on one token
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:
        return _PROCESS_TOKEN  # read-only home: an order for this process only
    return _read(path) or _PROCESS_TOKEN


@dataclass(frozen=True, slots=True)
class ChoiceOrder:
    """How one question's choices are shown: display position ``j`` shows choice ``order[j]``
    of the quiz file. Grading works on the file's indices, so a response in display positions
    goes through :meth:`to_original` first."""

    qid: str
    order: tuple[int, ...]

    @classmethod
    def identity(cls, q: Question) -> ChoiceOrder:
        return cls(q.id, tuple(range(len(q.choices))))

    @classmethod
    def for_learner(cls, q: Question, token: str) -> ChoiceOrder:
        """A permutation fixed by (token, question id): sort the choices by a hash of both, so
        the same learner always sees the same order and the draw is independent of Python's
        random module across versions."""
        def key(i: int) -> bytes:
            return hashlib.sha256(f"{token}\0{q.id}\0{i}".encode()).digest()

        return cls(q.id, tuple(sorted(range(len(q.choices)), key=key)))

    def _one(self, pos: object) -> int:
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < len(self.order):
            raise ConfigError(f"quiz {self.qid}: display position {pos!r}",
                              "it is not one of the question's shown choices",
                              f"use an int in 0..{len(self.order) - 1}")
        return self.order[pos]

    def to_original(self, response: int | Iterable[int] | None) -> int | list[int] | None:
        """Map a response given in display positions (one int, or a collection of ints) to the
        quiz file's choice indices; None (nothing picked) stays None."""
        if response is None:
            return None
        if isinstance(response, int):
            return self._one(response)
        return sorted(self._one(p) for p in response)

    def to_display(self, index: int) -> int:
        """The display position of the quiz file's choice ``index``."""
        return self.order.index(index)
