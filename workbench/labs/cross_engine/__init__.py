"""The cross-engine lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.cross_engine.lab import CrossEngineLab

__all__ = ["CrossEngineLab"]
