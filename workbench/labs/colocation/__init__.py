"""The colocation lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.colocation.lab import ColocationLab

__all__ = ["ColocationLab"]
