"""The kv-capacity lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.kv_capacity.lab import KVCapacityLab

__all__ = ["KVCapacityLab"]
