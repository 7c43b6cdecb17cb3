"""The tier model as a simulated engine's KV connector (an LMCache-style connector on the
vLLM-like engine; :class:`workbench.engines.sched.vllm_sched.KVConnector`).

At admission the scheduler asks :meth:`TierConnector.lookup` how many leading tokens beyond the
engine's own prefix-cache (HBM) hit the tiers can supply, allocates blocks for them and calls
:meth:`load`; those tokens skip prefill compute. The SimPy driver then puts the load time
(lookup + retrieve + host-to-device copy) on the step that admitted the request
(:meth:`take_load_s`: a synchronous load, before the forward), and after the step that finishes a
prompt's prefill it saves the prompt's chunks (:meth:`saved`): the device-to-host copy is on the
engine's path, the put to the remote store is not (it is counted, not waited for).
"""

from __future__ import annotations

from collections.abc import Iterable

from workbench.engines.sched.request import Request
from workbench.tiers.model import Retrieval, SaveCost, TierStack


class TierConnector:
    def __init__(self, stack: TierStack, *, save: bool = True):
        self.stack = stack
        self.save = save
        self.loads: dict[int, Retrieval] = {}  # rid -> its (first) load
        self.saves: dict[int, SaveCost] = {}
        self._pending_s = 0.0

    def lookup(self, req: Request, local_tokens: int) -> int:
        return self.stack.plan(req.tokens, local_tokens).new_tokens

    def load(self, req: Request, local_tokens: int, tokens: int) -> None:
        r = self.stack.retrieve(req.tokens, local_tokens)
        self.loads.setdefault(req.rid, r)
        self._pending_s += r.load_s

    def take_load_s(self) -> float:
        s, self._pending_s = self._pending_s, 0.0
        return s

    def saved(self, reqs: Iterable[Request]) -> float:
        """Save each request's prompt; returns the seconds on the engine's path (D2H)."""
        if not self.save:
            return 0.0
        total = 0.0
        for r in reqs:
            c = self.stack.save(r.tokens[:r.prompt_len])
            self.saves.setdefault(r.rid, c)
            total += c.d2h_s
        return total
