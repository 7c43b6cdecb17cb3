"""The state a KV transfer touches (pure, no SimPy): blocks being written or read by a copy, and
a namespaced object store split into lookup (metadata) and payload (seed 003 E6, E8).

The rules the fault rows test, each one guarded by a flag a test can turn off to show that the
guard is what keeps the seed's correctness criterion (``guards=False`` is the unsafe variant):

* a block that a copy is still writing, or that a save or a remote reader still pins, is not
  reused: freeing it is deferred until the copy ends or the pin drops;
* a pin taken for a remote reader is a lease with an expiry, so a reader that died cannot hold a
  block for ever; a block reused after that carries a new generation, and a read that names the
  old generation is refused;
* store keys include the namespace (model and adapter identity); an object is visible to lookup
  only once its payload is complete; eviction skips objects being read or written.

A token's KV content is a hash of the namespace and the token prefix up to it, so a model's
"output" (:func:`output_of`) changes if any KV it reads is stale, foreign or missing.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from workbench.errors import ConfigError

EMPTY = 0  # a block slot never written


def kv_content(namespace: str, tokens: list[int] | tuple[int, ...], i: int) -> int:
    """The KV of token ``i``: a function of the namespace and the prefix ``tokens[:i + 1]``."""
    h = hashlib.blake2b(f"{namespace}|{tuple(tokens[:i + 1])}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") or 1


def prefill(namespace: str, tokens: list[int]) -> list[int]:
    """The KV of every token, as a full prefill computes it."""
    return [kv_content(namespace, tokens, i) for i in range(len(tokens))]


def output_of(kv: list[int]) -> int:
    """The first output token a model computes from this KV (any wrong slot changes it)."""
    return int.from_bytes(hashlib.blake2b(repr(kv).encode(), digest_size=4).digest(), "little")


@dataclass(slots=True)
class Block:
    data: list[int]
    writing: bool = False  # a copy is filling it
    pins: int = 0  # saves or remote readers that must see its current data
    lease_until: float | None = None  # a remote reader's pin expires here
    generation: int = 0  # bumped on every reuse
    owner: str | None = None
    free_pending: bool = False  # freed while busy: returns to the free list when idle


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots; ``guards`` as in the module doc."""

    def __init__(self, num_blocks: int, block_size: int = 4, *, guards: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(f"pool of {num_blocks} x {block_size}", "is empty",
                              "use at least one block of one token")
        self.block_size, self.guards = block_size, guards
        self.blocks = [Block([EMPTY] * block_size) for _ in range(num_blocks)]
        self.free: list[int] = list(range(num_blocks))

    def alloc(self, n: int, owner: str) -> list[int] | None:
        """``n`` free blocks or None (a miss, never a partial result)."""
        if n > len(self.free):
            return None
        got, self.free = self.free[:n], self.free[n:]
        for b in got:
            blk = self.blocks[b]
            blk.generation += 1
            blk.owner, blk.free_pending = owner, False
        return got

    def release(self, ids: list[int], now: float = 0.0) -> list[int]:
        """Free ``ids``; busy ones (writing, pinned) are deferred. Returns those deferred."""
        deferred = []
        for b in ids:
            blk = self.blocks[b]
            if self.guards and (blk.writing or self._pinned(blk, now)):
                blk.free_pending = True
                deferred.append(b)
            else:
                self._to_free(b)
        return deferred

    def _pinned(self, blk: Block, now: float) -> bool:
        if blk.lease_until is not None and now >= blk.lease_until:
            blk.pins, blk.lease_until = 0, None  # the lease expired: the reader is gone
        return blk.pins > 0

    def _to_free(self, b: int) -> None:
        blk = self.blocks[b]
        blk.owner, blk.free_pending, blk.pins, blk.lease_until = None, False, 0, None
        if b not in self.free:
            self.free.append(b)

    def settle(self, now: float) -> list[int]:
        """Return deferred blocks whose copy ended or whose pins dropped (or lease expired)."""
        done = [b for b, blk in enumerate(self.blocks) if blk.free_pending and not blk.writing
                and not self._pinned(blk, now)]
        for b in done:
            self._to_free(b)
        return done

    def write(self, b: int, data: list[int]) -> None:
        self.blocks[b].data = list(data)

    def pin(self, ids: list[int], lease_until: float | None = None) -> None:
        for b in ids:
            self.blocks[b].pins += 1
            self.blocks[b].lease_until = lease_until

    def unpin(self, ids: list[int]) -> None:
        for b in ids:
            self.blocks[b].pins = max(0, self.blocks[b].pins - 1)

    def read(self, b: int, generation: int | None = None) -> list[int] | None:
        """The block's data; None if ``generation`` names an older use of the block."""
        blk = self.blocks[b]
        if self.guards and generation is not None and blk.generation != generation:
            return None
        return list(blk.data)

    @property
    def held(self) -> int:
        return len(self.blocks) - len(self.free)


@dataclass(slots=True)
class StoredObject:
    data: list[int]
    complete: bool = False
    readers: int = 0


@dataclass(slots=True)
class ObjectStore:
    """Objects keyed by (namespace, chunk hash); ``capacity`` objects, LRU eviction."""

    capacity: int
    guards: bool = True
    objects: OrderedDict = field(default_factory=OrderedDict)
    metadata_requests: int = 0
    evicted: list = field(default_factory=list)

    def key(self, namespace: str, chunk_hash: int) -> tuple:
        return (namespace, chunk_hash) if self.guards else ("", chunk_hash)

    def lookup(self, key: tuple) -> bool:
        self.metadata_requests += 1
        obj = self.objects.get(key)
        return obj is not None and (obj.complete or not self.guards)

    def get(self, key: tuple) -> StoredObject | None:
        obj = self.objects.get(key)
        if obj is None or (self.guards and not obj.complete):
            return None
        self.objects.move_to_end(key)
        return obj

    def admit(self, key: tuple) -> StoredObject | None:
        """Room for a new object (evicting idle ones, LRU first); None when nothing may go."""
        if key in self.objects:
            return self.objects[key]
        while len(self.objects) >= self.capacity:
            victim = next((k for k, o in self.objects.items()
                           if not self.guards or (o.complete and o.readers == 0)), None)
            if victim is None:
                return None  # admission refused: every object is in use
            self.evicted.append(victim)
            obj = self.objects.pop(victim)  # its buffer is reused in place, as a slab would be
            obj.complete = False
            self.objects[key] = obj
            return obj
        obj = StoredObject([])
        self.objects[key] = obj
        return obj

    def delete(self, key: tuple) -> None:
        self.objects.pop(key, None)
