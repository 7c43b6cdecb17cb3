"""The output-equality lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.output_equality.lab import OutputEqualityLab

__all__ = ["OutputEqualityLab"]
