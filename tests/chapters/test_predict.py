"""Predict first: the check hides the outcome until a guess is written, and ask runs nothing."""

from __future__ import annotations

from workbench.viz.predict import ask, check


def test_no_guess_hides_the_outcome_and_runs_nothing():
    ran = []
    assert "No prediction yet (the knee)" in check(None, 16, what="the knee")
    assert "16" not in check(None, 16, what="the knee")
    assert ask(None, lambda: ran.append(1), what="x").startswith("No prediction yet")
    assert ran == []


def test_a_guess_is_checked_against_the_run():
    assert check(16, 16, what="knee").endswith(": right (knee)")
    assert "not what the run gave" in check(15, 16, what="knee")
    assert ": right" in check(195.3, 195.31, what="f", tolerance=0.05)
    assert "not what the run gave" in check(1, True, what="b")  # a bool is not a number here
    assert "not what the run gave" in check(True, 1.0, what="n")  # nor a number a bool
    assert ": right" in check("retired", "retired", what="state")
    assert ": right" in ask(4, lambda: 4, what="steps")


def test_a_verdict_and_a_refusal_read_as_booleans():
    from types import SimpleNamespace

    from workbench.errors import ConfigError
    from workbench.viz.predict import refused, supported

    def run(verdict):
        return SimpleNamespace(record=SimpleNamespace(verdict=verdict))

    assert supported(run("supported: every check holds"))
    assert not supported(run("Not supported in simulation: ...")) and not supported(run("refuted"))

    def bad():
        raise ConfigError("tp=1", "needs two ranks", "use tp >= 2")

    assert refused(bad) and not refused(lambda: 1)
