"""Prefill/decode disaggregation and KV transfers (seed 003 E7, E8), simulated, and one real
handover between two mini engines.

* :mod:`~workbench.pd.link` — the transfer link's cost (pure): bytes of a request's KV, latency
  plus bytes over bandwidth;
* :mod:`~workbench.pd.cluster` — the SimPy driver: prefill and decode instances joined by a link
  (a SimPy resource, so transfers queue), against colocated serving at the same GPU count;
* :mod:`~workbench.pd.handover` — the transfer protocol's state (pure): pinned sources, landing
  blocks, a namespaced object store; :mod:`~workbench.pd.faults` drives its seven fault rows;
* :mod:`~workbench.pd.real` — the real handover (``PDPair``): a prefill and a decode mini engine,
  the prompt's KV blocks copied between their pools by :mod:`~workbench.pd.kvcopy`.

The link is deliberately small: one object with ``transfer_s(nbytes)`` and a queue, so a richer
transfer path (tiers, a metadata service) can replace it behind the same two calls.
"""
