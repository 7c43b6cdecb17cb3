"""The charge taken where SGLang's scheduler admits work (both plans use it).

SGLang admits a prefill when ``available_size() + evictable_size()`` covers it
(``PrefillAdder.add_one_req``) and a decode step when ``check_decode_mem`` passes, then
allocates. Under a GPU budget shared with other processes the headroom behind
``available_size()`` may be mapped by another process in between, and SGLang raises on the
miss. Here each admission first holds the pages it will map charged to the budget
(:meth:`LedgerSlots.admit`, the pass's running total): a request whose charge misses is not
admitted this pass (``NO_TOKEN``, as SGLang answers when memory is short), a decode step whose
charge misses fails the check (SGLang retracts, as for any shortfall). The charge is consumed by
the allocation that follows, and pages SGLang evicts for it meanwhile keep their charge for it
(freed to the budget, another process could map them before the allocation); what is left is
credited back after the allocation, when a request is not admitted, or when the next admission
pass starts.

Engine-free: the wrappers read only the adder's and the batch's attributes that the plans'
checks name; an allocator that is not the elastic one is left alone."""

from __future__ import annotations

from typing import Any

from workbench.adapters.sglang.slots import LedgerSlots

ADMITTED = "_workbench_admitted"  # the slots an adder's admitted requests will allocate


def elastic(owner: Any) -> LedgerSlots | None:
    """The elastic allocator ``owner`` (an adder, a batch) allocates from, if it has one."""
    allocator = getattr(owner, "token_to_kv_pool_allocator", None)
    return allocator if isinstance(allocator, LedgerSlots) else None


def prefix_tokens(req: Any) -> int:
    """A request's prefix already on the device (0.5.23: ``prefix_len``; 0.5.16: its
    ``prefix_indices``; the plans' checks name which)."""
    prefix = getattr(req, "prefix_len", None)
    return len(req.prefix_indices) if prefix is None else int(prefix)


def request_slots(req: Any, page_size: int) -> int:
    """The slots a request's prefill may allocate this pass: its tokens past the cached prefix
    in whole pages, plus the page a paged allocation may take at the boundary."""
    n = max(0, len(req.full_untruncated_fill_ids) - prefix_tokens(req))
    paged = -(-n // page_size) * page_size
    return paged + (page_size if page_size > 1 and n else 0)


def make_adder_init(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        slots = elastic(self)
        if slots is not None:
            slots.release_admission()  # a pass that allocated nothing leaves no charge
        setattr(self, ADMITTED, 0)
    return __init__


def make_add_one_req(orig, no_token):
    """``PrefillAdder.add_one_req``: charged before SGLang decides, ``no_token`` if the charge
    misses, the charge shrunk back to the admitted ones if SGLang does not take it. A request
    whose tokens the room and the cache together cannot hold is not charged at all (SGLang
    refuses it anyway), so it never holds headroom another process's admission needs."""
    def add_one_req(self, req, *args, **kwargs):
        slots = elastic(self)
        if slots is None:
            return orig(self, req, *args, **kwargs)
        admitted = getattr(self, ADMITTED, 0)
        want = admitted + request_slots(req, slots.page_size)
        could = want <= slots.room_slots() + self.tree_cache.evictable_size()
        if could and not slots.admit_up_to(want):
            return no_token
        before = len(self.can_run_list)
        result = orig(self, req, *args, **kwargs)
        if len(self.can_run_list) > before:
            if could or slots.admit_up_to(want):  # (SGLang took more than the room showed)
                setattr(self, ADMITTED, want)
        elif could:
            slots.admit_up_to(admitted)
        return result
    return add_one_req


def make_add_chunked_req(orig):
    """``PrefillAdder.add_chunked_req``: SGLang must run a chunked request's next chunk, so it
    is charged after SGLang takes it (a refusal here would strand the chunk's pages)."""
    def add_chunked_req(self, req, *args, **kwargs):
        before = len(self.can_run_list)
        result = orig(self, req, *args, **kwargs)
        slots = elastic(self)
        if slots is not None and len(self.can_run_list) > before:
            want = getattr(self, ADMITTED, 0) + request_slots(req, slots.page_size)
            if slots.admit_up_to(want):
                setattr(self, ADMITTED, want)
        return result
    return add_chunked_req


def make_check_decode_mem(orig):
    """``ScheduleBatch.check_decode_mem``: the step's tokens charged once SGLang's own check
    passes; a miss fails the check, and SGLang retracts."""
    def check_decode_mem(self, *args, **kwargs):
        if not orig(self, *args, **kwargs):
            return False
        slots = elastic(self)
        if slots is None:
            return True
        need = self.new_tokens_required_next_decode(kwargs.get("selected_indices",
                                                               args[0] if args else None))
        return need <= 0 or slots.admit(need)
    return check_decode_mem
