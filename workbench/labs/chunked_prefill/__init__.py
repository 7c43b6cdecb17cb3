"""The chunked-prefill lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.chunked_prefill.lab import ChunkedPrefillLab

__all__ = ["ChunkedPrefillLab"]
