"""SGLang's allocator contract on the workbench ledger, engine-free: a slot index is ``page *
page_size + offset`` with ``page`` a ledger block, a miss is ``None`` (which SGLang does not
expect: below), a free goes through the ledger's fence. The elastic allocators (``allocator.py``)
mix :class:`LedgerSlots` into SGLang's own classes; a chapter cell drives the same code without
SGLang (:meth:`LedgerSlots.over`).

SGLang admits work when ``available_size() + evictable_size()`` covers it, then evicts from its
radix cache and allocates; ``alloc_token_slots`` raises "Out of memory" if that allocation misses,
so ``available_size()`` must count only what memory can back now. While a limit shrinks the pool, a
block freed there may retire with its page instead of becoming free, so the tokens an eviction
frees would not all come back. Blocks freed while shrinking are therefore *held back* until the
next allocation has had its chance at them (it takes them only after the ledger's own free
blocks); whatever it leaves goes back to the ledger, where pages retire as before. Mapped memory
never grows for it: held blocks are on pages already mapped.

Under a GPU budget shared with other processes the same promise needs memory never held: the
headroom SGLang admitted on may be mapped by another process before SGLang allocates.
:meth:`LedgerSlots.admit` is the charge taken at admission: the pages the admitted slots will map
are charged to the budget at once (``BudgetedDevice.prepay``), the allocation that follows maps
them from that charge, and what it leaves is credited back."""

from __future__ import annotations

import torch

from workbench.core.ledger_state import checked_free_ids
from workbench.errors import ConfigError


def page_slots(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """Every slot of ``pages``, in order: ``page * page_size + [0, page_size)``."""
    return (pages[:, None] * page_size
            + torch.arange(page_size, device=pages.device)).reshape(-1)


def ledger_of(kvcache):
    ledger = getattr(kvcache, "ledger", None)
    if ledger is None:
        raise ConfigError(f"KV pool {type(kvcache).__name__}", "has no workbench ledger",
                          "build the pool as ElasticMHATokenToKVPool (autopatch does)")
    return ledger


class LedgerSlots:
    """What the elastic allocators add to SGLang's (``allocator.py`` mixes it in first): ids
    from the ledger, ``None`` on a miss, frees through the ledger's fence. :meth:`over` builds
    one without SGLang (a chapter cell, a test)."""

    ledger = None

    @classmethod
    def over(cls, ledger, page_size: int = 1, device: str = "cpu") -> LedgerSlots:
        """Slots over ``ledger`` alone, as SGLang's allocator would hold them."""
        self = cls.__new__(cls)
        self.ledger, self.page_size, self.device = ledger, page_size, device
        self.size = ledger.geometry.num_blocks * page_size
        self.held_back = []
        return self

    # alloc_slots / free_slots, not SGLang's alloc / free: mixed in first, a name SGLang's
    # classes also define would replace theirs
    def alloc_slots(self, need_size: int):
        """``need_size`` slots (whole pages of ``page_size``), or ``None`` on a miss."""
        pages = self._ids(need_size // self.page_size)
        return None if pages is None else page_slots(pages, self.page_size)

    def admit(self, need_slots: int) -> bool:
        """Promise ``need_slots`` slots to the next allocation: True when they are there now,
        the pages they need beyond what is mapped held charged to the GPU budget (another
        process's charge cannot take them in between); False, the charge held before kept, when
        they are not. Pages released while a promise holds keep their charge for it. Each call
        sets the whole promise (an admission pass calls it with its running total), so a growing
        promise never gives back what it holds in between."""
        ledger = self.ledger
        need = -(-need_slots // self.page_size)
        self._room()  # (held-back blocks given back, a waiting kvctl request applied)
        room, headroom = ledger._available()  # one reading of the device: room and new pages
        if need > room:
            return False
        pages = ledger.pages
        device = pages.space.device
        if not hasattr(device, "prepay"):
            return True  # no shared budget: the headroom is this process's alone
        bpp = ledger.geometry.blocks_per_page(0)
        mapped_room = max(0, room - pages.new_pages_within(headroom) * bpp)
        new_pages = -(-max(0, need - mapped_room) // bpp)
        return device.prepay(new_pages * ledger.geometry.page_id_bytes)

    def admit_up_to(self, total_slots: int) -> bool:
        """:meth:`admit` what of ``total_slots`` the pool's room serves now; SGLang takes the
        rest from what it evicts first, whose pages keep their charge for this promise (a promise
        of nothing holds nothing)."""
        if total_slots <= 0:
            self.release_admission()
            return True
        return self.admit(min(total_slots, self.room_slots()))

    def room_slots(self) -> int:
        """Slots an allocation could take now."""
        return self._room() * self.page_size

    def release_admission(self) -> None:
        """Credit back what an admission prepaid and its allocation did not use."""
        refund = getattr(self.ledger.pages.space.device, "refund", None)
        if refund is not None:
            refund()

    def free_slots(self, slots: torch.Tensor) -> None:
        """Give back the pages of ``slots`` (every slot of each page, as SGLang frees them)."""
        self._free_blocks(sorted({int(s) // self.page_size for s in slots.tolist()}))

    def _reset(self) -> None:
        self.held_back = []  # (their ids are still allocated: freed with the rest below)
        held = sorted(self.ledger.allocated - {self.ledger.null_block})
        self.ledger.free_reserved()
        if held:
            self._release(held)
        self.free_pages = None  # there is no free list: get_all_free_pages() answers None
        self.release_pages = None
        self.free_group = None

    def _ids(self, n: int) -> torch.Tensor | None:
        fence = self.ledger.fence
        if fence is not None:
            fence.poll()
        ids = self.ledger.alloc(n)
        if ids is None and fence is not None and fence.drain():
            ids = self.ledger.alloc(n)
        if ids is None and self.held_back:
            ids = self._with_held_back(n)
        if self.held_back:
            self._give_back()
        self.release_admission()  # an admission covers the one allocation that follows it
        return None if ids is None else torch.tensor(ids, dtype=torch.int64, device=self.device)

    def _with_held_back(self, n: int) -> list[int] | None:
        """``n`` blocks: what the ledger can give, the rest from the held-back blocks (lowest
        pages first, so the retiring tail drains); None if both together are short."""
        own = min(self.ledger.available_size(), n)
        if own + len(self.held_back) < n:
            return None
        rest = self.ledger.alloc(own) if own else []
        if rest is None:
            return None
        self.held_back.sort()
        taken, self.held_back = self.held_back[:n - own], self.held_back[n - own:]
        return rest + taken

    def _give_back(self) -> None:
        ids, self.held_back = self.held_back, []
        self._release(ids)

    def _free_blocks(self, ids: list[int]) -> None:
        if not self.ledger.pages.shrinking:
            self._release(ids)
            return
        # held for the allocation SGLang's eviction is for; checked as the ledger's free checks
        ids = checked_free_ids(self.ledger, ids)
        again = set(ids).intersection(self.held_back)
        if again:
            raise ConfigError(f"free of block {min(again)}", "it is already freed (double free?)",
                              "free each id once, after alloc returned it")
        self.held_back.extend(ids)

    def _release(self, ids: list[int]) -> None:
        self.ledger.free(ids)
        if self.ledger.fence is not None:
            self.ledger.fence.after_free()

    def _room(self) -> int:
        """Blocks an allocation could take now (finished releases counted). SGLang asks this
        also when idle (its pool stats and idle checks), so a ``kvctl`` request waiting in the
        control segment is applied here too, not only at the next allocation or free."""
        if self.held_back:  # asked before SGLang evicts: what is held is no longer promised
            self._give_back()
        if self.ledger.fence is not None:
            self.ledger.fence.poll()
        self.ledger.poll_control()
        return self.ledger.available_size()

    def unheld_size(self) -> int:
        """Slots not held by anyone: what SGLang's leak check counts as free (the ledger's
        ``available_size`` is lower under a limit or device pressure, and that is no leak)."""
        return self.size - (self.ledger.used_blocks - len(self.held_back)) * self.page_size

    def merge_and_sort_free(self):
        pass
