"""The same-engine-pair lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.same_engine_pair.lab import SameEnginePairLab

__all__ = ["SameEnginePairLab"]
