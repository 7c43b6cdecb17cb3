"""The baseline lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.baseline.lab import BaselineLab

__all__ = ["BaselineLab"]
