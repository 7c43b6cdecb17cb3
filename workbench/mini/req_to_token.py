"""SGLang's ``req_to_token``: one persistent device table of token slots per running request.

Row ``r`` of ``table`` (``[max_reqs + 1, max_context / E]`` int32 on the KV device) lists the
table entries of the request that holds row ``r``, each covering ``E = entry_tokens`` positions:
with ``E = 1`` (the token-slot style) the cache slot of every position, SGLang's ``req_to_token``;
with ``E = block_size`` (the block style) its block ids, vLLM's persistent block table. The table
is never rebuilt: each step writes only the entries its new positions start (one scatter on the
device), so the host does O(new tokens) work instead of O(batch x context). The decode kernel
reads a request's entries through its row index (``rows``), which is why the table is
graph-safe: its address and shape never change, only its contents.

A request takes a row the first time it is scheduled and gives it back once it is no longer
running (finished, aborted or preempted). After a preemption its positions are written again from
0 (recompute, or a prefix hit whose blocks may be another request's), so no stale slot is ever
read. The last row is the padding row (all 0: the null block's) for padded graph batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from workbench.engines.sched.request import ReqState, Request
from workbench.errors import ConfigError


@dataclass(slots=True)
class _Row:
    row: int
    written: int  # entries 0..written-1 hold this request's slots (E=1) or blocks
    preemptions: int  # the request's count when these slots were written


class ReqToToken:
    """The table, its row allocator, and the incremental per-step write."""

    def __init__(self, max_reqs: int, max_context: int, device: torch.device,
                 entry_tokens: int = 1):
        if max_reqs < 1 or max_context < 1:
            raise ConfigError(f"req_to_token of {max_reqs} x {max_context}",
                              "needs at least one request row and one position",
                              "pass max_num_seqs >= 1 and a model with positions")
        self.max_reqs, self.max_context, self.entry_tokens = max_reqs, max_context, entry_tokens
        width = -(-max_context // entry_tokens)
        self.table = torch.zeros(max_reqs + 1, width, dtype=torch.int32, device=device)
        self.pad_row = max_reqs
        self._free = list(range(max_reqs - 1, -1, -1))
        self._rows: dict[Request, _Row] = {}

    def row_of(self, req: Request) -> int:
        return self._rows[req].row

    @property
    def rows_in_use(self) -> int:
        return len(self._rows)

    def _release_stale(self) -> None:
        for req in [r for r in self._rows if r.state is not ReqState.RUNNING]:
            self._free.append(self._rows.pop(req).row)

    def _entry(self, req: Request) -> _Row:
        e = self._rows.get(req)
        if e is None:
            if not self._free:
                raise ConfigError(f"{self.max_reqs + 1}th running request",
                                  "req_to_token has one row per running request",
                                  "build it with max_reqs >= the scheduler's max_num_seqs")
            e = self._rows[req] = _Row(self._free.pop(), 0, req.preemptions)
        elif e.preemptions != req.preemptions:  # recomputed: its old slots are gone
            e.written, e.preemptions = 0, req.preemptions
        return e

    def update(self, items: Sequence[tuple[Request, int]], entry: Callable[[Request, int], int]
               ) -> list[int]:
        """Write entries ``written .. `` up to the one of position ``num_computed + n - 1`` of
        every scheduled ``(request, n)`` (one device scatter; ``entry(req, i)``: the slot of
        position ``i`` or the id of block ``i``); returns each item's row."""
        per = self.entry_tokens
        self._release_stale()
        rows: list[int] = []
        w_row: list[int] = []
        w_pos: list[int] = []
        w_slot: list[int] = []
        for req, n in items:
            e = self._entry(req)
            end = req.num_computed + n
            if end > self.max_context:
                raise ConfigError(f"position {end - 1}", f"past req_to_token's {self.max_context}",
                                  "build it with the model's max_position")
            rows.append(e.row)
            need = -(-end // per)
            for i in range(e.written, need):
                w_row.append(e.row)
                w_pos.append(i)
                w_slot.append(entry(req, i))
            e.written = max(e.written, need)
        if w_row:
            idx = torch.tensor([w_row, w_pos, w_slot], dtype=torch.long).to(self.table.device)
            self.table[idx[0], idx[1]] = idx[2].to(torch.int32)
        return rows

    def slots(self, row: int, length: int) -> torch.Tensor:
        """Cache slots of positions ``0..length-1`` of ``row`` (int64, for indexing)."""
        e = self.entry_tokens
        if e == 1:
            return self.table[row, :length].long()
        t = torch.arange(length, device=self.table.device)
        return self.table[row, t // e].long() * e + t % e
