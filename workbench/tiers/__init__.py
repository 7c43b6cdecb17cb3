"""KV tiers beyond HBM (seed 003 E5, E6, E9): the pure model (:mod:`.model`, :mod:`.presets`)
and the simulated engines' connector on top of it (:mod:`.sim`)."""

from __future__ import annotations

from workbench.tiers.model import (
    RemoteStore,
    Retrieval,
    SaveCost,
    Tier,
    TierSpec,
    TierStack,
    chunk_keys,
    content_keys,
)
from workbench.tiers.presets import TierCosts, make_stack, make_store

__all__ = ["RemoteStore", "Retrieval", "SaveCost", "Tier", "TierSpec", "TierStack",
           "chunk_keys", "content_keys", "TierCosts", "make_stack", "make_store"]
