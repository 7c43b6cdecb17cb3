"""The tiered-retrieval lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.tiered_retrieval.lab import TieredRetrievalLab

__all__ = ["TieredRetrievalLab"]
