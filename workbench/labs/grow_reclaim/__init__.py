"""The grow-reclaim lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.grow_reclaim.lab import GrowReclaimLab

__all__ = ["GrowReclaimLab"]
