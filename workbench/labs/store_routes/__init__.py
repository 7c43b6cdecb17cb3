"""The store-routes lab (:mod:`.lab`: its params and its Lab; the runners and the report
beside it)."""

from workbench.labs.store_routes.lab import StoreRoutesLab

__all__ = ["StoreRoutesLab"]
