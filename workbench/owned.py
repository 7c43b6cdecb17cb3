"""What this process owns outside itself -- control segment files, socket directories, worker
processes -- and the one place they are undone on every way out.

A normal exit undoes them through their owners' ``close`` (and ``atexit`` catches what was left
open). A signal is the way out that skips both: the first time something is owned, handlers for
SIGTERM, SIGINT and SIGHUP are installed (where the process still has Python's defaults, and only
from the main thread). On a signal they undo everything owned, then hand the signal on: to the
handler that was there before when nothing was owned (Ctrl-C in a command that owns nothing
behaves as before), else to the default action, so the process ends *by the signal* and its exit
status says which (128 + N in a shell). A forked child inherits no ownership.

Undo functions must be quick and must not take locks a signal may have interrupted: unlink a
file that is still the one created, kill a child, remove a directory.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["own", "disown", "undo_all", "owned", "ended_by_signals", "Interrupted", "SIGNALS"]

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_owned: dict[int, tuple[int, str, Callable[[], None]]] = {}  # token -> (pid, what, undo)
_tokens = itertools.count(1)
_previous: dict[int, object] = {}
_installed = False


def own(what: str, undo: Callable[[], None]) -> int:
    """Register ``undo`` for something this process now owns; returns the token for
    :func:`disown` (call it once the owner has undone the thing itself)."""
    token = next(_tokens)
    _owned[token] = (os.getpid(), what, undo)
    _install()
    return token


def disown(token: int) -> None:
    _owned.pop(token, None)


def owned() -> list[str]:
    """What this process owns now (its own entries only, not a parent's)."""
    me = os.getpid()
    return [what for pid, what, _ in list(_owned.values()) if pid == me]


def undo_all() -> None:
    """Undo everything this process owns, newest first; one failure stops no other undo."""
    me = os.getpid()
    for token in sorted(list(_owned), reverse=True):
        pid, _, undo = _owned.pop(token, (0, "", None))
        if pid == me and undo is not None:
            try:
                undo()
            except Exception:  # noqa: BLE001 - exiting anyway: undo the rest
                pass


def _on_signal(signum: int, frame) -> None:
    mine = bool(owned())
    undo_all()
    before = _previous.get(signum)
    if not mine and callable(before):
        before(signum, frame)  # e.g. KeyboardInterrupt for a command that owns nothing
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # ends the process by the signal: its status says which


def _install() -> None:
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    for sig in SIGNALS:
        now = signal.getsignal(sig)
        if now in (signal.SIG_DFL, signal.default_int_handler):  # someone else's: theirs
            _previous[sig] = now
            signal.signal(sig, _on_signal)


class Interrupted(BaseException):
    """A signal, raised where the main thread was (so every ``finally`` runs)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def ended_by_signals() -> Iterator[None]:
    """For a command with its own orderly shutdown (a server): inside, SIGTERM, SIGINT and SIGHUP
    raise :class:`Interrupted`; once the shutdown in the ``finally`` blocks has run, the process
    ends by that signal (exit status 128 + N)."""
    def interrupt(signum: int, frame) -> None:  # noqa: ARG001
        raise Interrupted(signum)

    before = {sig: signal.signal(sig, interrupt) for sig in SIGNALS}
    try:
        yield
    except Interrupted as sig:
        undo_all()
        for s, h in before.items():
            signal.signal(s, h)
        signal.signal(sig.signum, signal.SIG_DFL)
        os.kill(os.getpid(), sig.signum)
        raise SystemExit(128 + sig.signum) from None  # not reached: the signal ends us
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _forget_in_child() -> None:
    _owned.clear()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(undo_all)
