"""The pd-split lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.pd_split.lab import PDSplitLab

__all__ = ["PDSplitLab"]
