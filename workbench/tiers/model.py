"""A KV tier model (seed 003 E5/E6; no SimPy here): HBM, pinned host DRAM and a remote store.

Each tier holds *chunks* of KV (``chunk_tokens`` tokens each, the granularity LMCache-style
caches store) in LRU order, with a capacity in bytes, a lookup cost, a read (retrieve) and a write
(save) bandwidth and a fixed cost per chunk moved. The remote store is split as a Mooncake-style
store is: a **metadata service** (the master: lookups and puts, each one request with its own
latency) and a **transfer path** (payload bytes over a bandwidth).

Identity follows the engines' hash chains (:func:`workbench.engines.sched.block_pool.hash_chain`):
a chunk's key depends on every token before it, so a chunk hits only if the whole prefix before
it is identical. A retrieval walks the chain from the first chunk and stops at the first chunk no
tier holds; chunks after that point are not used even if some tier still has them.

Eviction order: a chain is inserted and touched *tail first*, so its head chunk is the most
recently used and LRU takes a chain's tail before its head (the tail is useless without the head;
the head serves every request that shares it). The same rule as vLLM freeing blocks tail first.

The models of LMCache and Mooncake here follow their documented designs; nothing here is a
measurement of those systems, and every default cost is an assumption to be calibrated.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from workbench.engines.sched.block_pool import NONE_HASH, hash_block, hash_chain
from workbench.errors import ConfigError


def chunk_keys(tokens: Sequence[int], chunk_tokens: int) -> list[int]:
    """Chained keys of every full chunk: equal keys mean equal chunks *and* equal prefixes."""
    return hash_chain(tokens, chunk_tokens)


def content_keys(tokens: Sequence[int], chunk_tokens: int) -> list[int]:
    """Position-free keys (the chunk's tokens alone): what non-prefix reuse (E9) looks up."""
    return [hash_block(NONE_HASH, tokens[i:i + chunk_tokens])
            for i in range(0, len(tokens) - chunk_tokens + 1, chunk_tokens)]


@dataclass(frozen=True, slots=True)
class TierSpec:
    name: str
    capacity_bytes: int
    lookup_s: float = 0.0  # one lookup request to this tier
    read_bw: float = math.inf  # bytes/s out of the tier into host memory (inf: already there)
    write_bw: float = math.inf  # bytes/s into the tier on a save
    op_s: float = 0.0  # fixed cost per chunk moved (descriptor, RPC, copy launch)
    on_device: bool = False  # HBM: a hit needs no host-to-device copy
    batch_keys: int = 0  # keys per metadata request (0: one request per lookup)


class Tier:
    """One tier: chunk keys in LRU order (oldest first) with the instance that saved each."""

    def __init__(self, spec: TierSpec, chunk_bytes: int):
        if chunk_bytes <= 0:
            raise ConfigError(f"chunk of {chunk_bytes} bytes", "a chunk must hold some KV",
                              "use chunk_tokens >= 1 and a model with KV")
        self.spec = spec
        self.name = spec.name
        self.chunk_bytes = chunk_bytes
        self.capacity_chunks = spec.capacity_bytes // chunk_bytes
        self.lru: OrderedDict[int, str] = OrderedDict()
        self.evictions = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def __contains__(self, key: int) -> bool:
        return key in self.lru

    def __len__(self) -> int:
        return len(self.lru)

    @property
    def used_bytes(self) -> int:
        return len(self.lru) * self.chunk_bytes

    def touch(self, keys: Sequence[int]) -> None:
        """Mark ``keys`` (a chain, head first) used now, tail first so the head ends newest."""
        for k in reversed(keys):
            if k in self.lru:
                self.lru.move_to_end(k)

    def put(self, keys: Sequence[int], owner: str = "") -> list[int]:
        """Insert a chain (head first; tail inserted first); returns the evicted keys."""
        evicted: list[int] = []
        if self.capacity_chunks <= 0:
            return evicted
        for k in reversed(keys):
            if k in self.lru:
                self.lru.move_to_end(k)
                continue
            while len(self.lru) >= self.capacity_chunks:
                evicted.append(self.lru.popitem(last=False)[0])
            self.lru[k] = owner
            self.bytes_in += self.chunk_bytes
        self.evictions += len(evicted)
        return evicted

    def victim(self) -> int | None:
        """The key LRU would evict next."""
        return next(iter(self.lru), None)

    def clear(self) -> None:
        self.lru.clear()


class RemoteStore(Tier):
    """A shared store: a metadata service (master) and a transfer path, shared by instances."""

    def __init__(self, spec: TierSpec, chunk_bytes: int):
        super().__init__(spec, chunk_bytes)
        self.metadata_requests = 0  # lookups + puts answered by the master
        self.metadata_s = 0.0
        self.payload_read = 0  # bytes over the transfer path
        self.payload_written = 0
        self.transfer_s = 0.0

    def meta(self, keys: int) -> tuple[int, float]:
        """Requests and seconds for asking the master about ``keys`` keys."""
        if keys <= 0:
            return 0, 0.0
        b = self.spec.batch_keys
        n = 1 if b <= 0 else math.ceil(keys / b)
        self.metadata_requests += n
        self.metadata_s += n * self.spec.lookup_s
        return n, n * self.spec.lookup_s

    def move(self, chunks: int, *, write: bool) -> float:
        """Seconds to move ``chunks`` over the transfer path (counted as payload)."""
        nbytes = chunks * self.chunk_bytes
        bw = self.spec.write_bw if write else self.spec.read_bw
        s = chunks * self.spec.op_s + nbytes / bw
        if write:
            self.payload_written += nbytes
        else:
            self.payload_read += nbytes
        self.transfer_s += s
        return s


@dataclass(slots=True)
class Retrieval:
    """What a lookup found and what moving it costs (seconds are serial, not overlapped)."""

    hit_tokens: int = 0  # leading tokens the tiers can supply (skip included)
    new_tokens: int = 0  # of which beyond ``skip`` (what is actually moved)
    chunks: dict[str, int] = field(default_factory=dict)  # moved chunks per source tier
    lookup_s: float = 0.0
    retrieve_s: float = 0.0  # remote -> host over the transfer path
    h2d_s: float = 0.0  # host -> HBM
    metadata_requests: int = 0
    payload_bytes: int = 0  # over the store's transfer path
    h2d_bytes: int = 0
    cross_instance_chunks: int = 0  # remote chunks another instance saved

    @property
    def load_s(self) -> float:
        return self.lookup_s + self.retrieve_s + self.h2d_s


@dataclass(slots=True)
class SaveCost:
    d2h_s: float = 0.0  # HBM -> pinned host copy: on the engine's path
    remote_s: float = 0.0  # put to the store: off the engine's path (asynchronous)
    chunks: dict[str, int] = field(default_factory=dict)
    metadata_requests: int = 0
    payload_bytes: int = 0


class TierStack:
    """The tiers one instance sees, fastest first; the remote store may be shared."""

    def __init__(self, tiers: Iterable[Tier], *, chunk_tokens: int, kv_bytes_per_token: int,
                 pcie_bw: float = 25e9, pcie_op_s: float = 5e-6, owner: str = "engine",
                 promote: bool = True):
        self.tiers = list(tiers)
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ConfigError(f"tiers {names}", "two tiers share a name",
                              "name each tier once (hbm, dram, remote)")
        self.chunk_tokens = chunk_tokens
        self.chunk_bytes = chunk_tokens * kv_bytes_per_token
        for t in self.tiers:
            if t.chunk_bytes != self.chunk_bytes:
                raise ConfigError(f"tier {t.name!r}", f"stores {t.chunk_bytes}-byte chunks, the "
                                  f"stack {self.chunk_bytes}", "build every tier with the "
                                  "stack's chunk_tokens * kv_bytes_per_token")
        self.pcie_bw, self.pcie_op_s = pcie_bw, pcie_op_s
        self.owner, self.promote = owner, promote
        self.lookups = 0
        self.hit_tokens = 0
        self.queried_tokens = 0

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise ConfigError(f"tier {name!r}", "is not in this stack",
                          f"use one of {[t.name for t in self.tiers]}")

    def where(self, key: int) -> Tier | None:
        return next((t for t in self.tiers if key in t), None)

    def _walk(self, keys: Sequence[int], first: int, limit: int) -> tuple[list[Tier], int]:
        """Source tier of chunks ``first..`` until the first chunk no tier holds."""
        src: list[Tier] = []
        for k in keys[first:limit]:
            t = self.where(k)
            if t is None:
                break
            src.append(t)
        return src, first + len(src)

    def plan(self, tokens: Sequence[int], skip_tokens: int = 0) -> Retrieval:
        """Read-only: how many leading tokens could be retrieved, and from where (no cost)."""
        c = self.chunk_tokens
        keys = chunk_keys(tokens, c)
        limit = min(len(keys), (len(tokens) - 1) // c)  # at least one token is computed
        first = min(skip_tokens // c, limit)
        src, end = self._walk(keys, first, limit)
        r = Retrieval(hit_tokens=max(end * c, skip_tokens), new_tokens=max(end * c - skip_tokens,
                                                                          0))
        for t in src:
            r.chunks[t.name] = r.chunks.get(t.name, 0) + 1
        return r

    def retrieve(self, tokens: Sequence[int], skip_tokens: int = 0) -> Retrieval:
        """Look up, charge and perform the retrieval: touch, promote, count."""
        c = self.chunk_tokens
        keys = chunk_keys(tokens, c)
        limit = min(len(keys), (len(tokens) - 1) // c)
        first = min(skip_tokens // c, limit)
        src, end = self._walk(keys, first, limit)
        r = self.plan(tokens, skip_tokens)
        self.lookups += 1
        self.queried_tokens += len(tokens)
        self.hit_tokens += r.new_tokens
        missed = end < limit
        deepest = max((self.tiers.index(t) for t in src), default=-1)
        asked = self.tiers if missed else self.tiers[:deepest + 1]
        for i, t in enumerate(asked):  # a tier is asked about the chunks the faster ones lack
            lacking = sum(1 for s in src if self.tiers.index(s) >= i) + (1 if missed else 0)
            if isinstance(t, RemoteStore):
                n, s = t.meta(lacking)
                r.metadata_requests += n
                r.lookup_s += s
            elif lacking:
                r.lookup_s += t.spec.lookup_s
        for i, t in enumerate(self.tiers):
            mine = [keys[first + j] for j, s in enumerate(src) if s is t]
            if not mine:
                continue
            t.touch(mine)
            t.bytes_out += len(mine) * self.chunk_bytes
            if isinstance(t, RemoteStore):
                r.retrieve_s += t.move(len(mine), write=False)
                r.payload_bytes += len(mine) * self.chunk_bytes
                r.cross_instance_chunks += sum(1 for k in mine if t.lru[k] != self.owner)
            elif not math.isinf(t.spec.read_bw):
                r.retrieve_s += len(mine) * (t.spec.op_s + self.chunk_bytes / t.spec.read_bw)
            if not t.spec.on_device:
                r.h2d_bytes += len(mine) * self.chunk_bytes
                r.h2d_s += len(mine) * (self.pcie_op_s + self.chunk_bytes / self.pcie_bw)
            if self.promote:
                for up in self.tiers[:i]:
                    up.put(mine, self.owner)
        return r

    def save(self, tokens: Sequence[int]) -> SaveCost:
        """Write-through of every full chunk to every tier that lacks it (after a prefill)."""
        keys = chunk_keys(tokens, self.chunk_tokens)
        out = SaveCost()
        for t in self.tiers:
            new = [k for k in keys if k not in t]
            t.touch([k for k in keys if k in t])
            if not new:
                continue
            out.chunks[t.name] = len(new)
            if isinstance(t, RemoteStore):
                n, s = t.meta(len(new))
                out.metadata_requests += n
                out.remote_s += s + t.move(len(new), write=True)
                out.payload_bytes += len(new) * self.chunk_bytes
            elif not t.spec.on_device:
                out.d2h_s += len(new) * (self.pcie_op_s + self.chunk_bytes / self.pcie_bw)
            t.put(keys, self.owner)
        return out


__all__ = ["TierSpec", "Tier", "RemoteStore", "TierStack", "Retrieval", "SaveCost",
           "chunk_keys", "content_keys"]
