"""The dynamic-limit lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.dynamic_limit.lab import DynamicLimitLab

__all__ = ["DynamicLimitLab"]
