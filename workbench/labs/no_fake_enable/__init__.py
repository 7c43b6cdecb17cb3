"""The no-fake-enable lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.no_fake_enable.lab import NoFakeEnableLab

__all__ = ["NoFakeEnableLab"]
