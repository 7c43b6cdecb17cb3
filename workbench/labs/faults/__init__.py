"""The faults lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.faults.lab import FaultsLab

__all__ = ["FaultsLab"]
