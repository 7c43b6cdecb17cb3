"""The idle-footprint lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.idle_footprint.lab import IdleFootprintLab

__all__ = ["IdleFootprintLab"]
