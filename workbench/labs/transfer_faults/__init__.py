"""The transfer-faults lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.transfer_faults.lab import TransferFaultsLab

__all__ = ["TransferFaultsLab"]
