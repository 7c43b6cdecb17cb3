"""The non-prefix-reuse lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.non_prefix_reuse.lab import NonPrefixReuseLab

__all__ = ["NonPrefixReuseLab"]
