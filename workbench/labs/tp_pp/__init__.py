"""The tp-pp lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.tp_pp.lab import TpPpLab

__all__ = ["TpPpLab"]
