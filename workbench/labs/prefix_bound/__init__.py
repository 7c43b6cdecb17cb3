"""The prefix-bound lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.prefix_bound.lab import PrefixBoundLab

__all__ = ["PrefixBoundLab"]
