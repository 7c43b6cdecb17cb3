"""A host-memory KV tier for the mini engine (seed 003 E5 on real memory, LMCache-style).

Blocks of a prompt whose prefill finished are copied into host memory (pinned on CUDA, so the
copies run on the copy engines; plain CPU tensors on the host backend), in chunks of
``chunk_tokens`` tokens keyed by the tier model's chained chunk keys
(:func:`workbench.tiers.model.chunk_keys`): a chunk's key encodes every token before it, so a
chunk hits only if its whole prefix is identical. The bookkeeping (capacity, LRU, a chain's tail
evicted before its head) is the tier model's own :class:`~workbench.tiers.model.Tier`; this module
adds the bytes: one slot of ``chunk_tokens / block_size`` block rows per chunk.

A request whose prefix misses the engine's prefix cache (HBM) but hits this tier gets its blocks
from the scheduler as usual; :meth:`HostTier.load` then fills them by host-to-device copies into
the (VMM-backed or static) KV and the request prefills only the rest. Each load is split into
*lookup* (hash the chain, walk it), *copy* (issue the copies) and *wait* (until the device has
them). Only the ``block`` style (contiguous layout: a block is one row of bytes across every
layer) is supported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError
from workbench.tiers.model import Tier, TierSpec, chunk_keys


@dataclass(slots=True)
class Load:
    """One retrieval into a request's blocks (seconds on the host clock)."""

    skip_tokens: int = 0  # the local (HBM) hit before it
    tokens: int = 0  # tokens retrieved
    chunks: int = 0
    blocks: int = 0
    copies: int = 0  # copy calls (one per run of consecutive destination blocks)
    nbytes: int = 0
    lookup_s: float = 0.0  # hash the chain and walk it
    copy_s: float = 0.0  # issue the host-to-device copies
    wait_s: float = 0.0  # until the device has them

    @property
    def load_s(self) -> float:
        return self.lookup_s + self.copy_s + self.wait_s


@dataclass(slots=True)
class Save:
    chunks: int = 0  # chunks copied (new to the tier)
    touched: int = 0  # chunks already there (made most recent)
    nbytes: int = 0
    seconds: float = 0.0  # device-to-host copies, waited for


def _runs(blocks: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(index, length) of each run of consecutive block ids: one copy per run."""
    i = 0
    while i < len(blocks):
        j = i + 1
        while j < len(blocks) and blocks[j] == blocks[j - 1] + 1:
            j += 1
        yield i, j - i
        i = j


class HostTier:
    """KV chunks in host memory over one KV's block rows (``[num_blocks, row_bytes]`` uint8)."""

    def __init__(self, rows: torch.Tensor, *, block_size: int, chunk_tokens: int,
                 capacity_bytes: int, pin: bool | None = None):
        if rows.dim() != 2 or rows.dtype != torch.uint8:
            raise ConfigError(f"rows of shape {tuple(rows.shape)} and {rows.dtype}",
                              "the tier copies whole block rows of bytes",
                              "pass KVStore.block_rows() (a [num_blocks, row_bytes] uint8 view)")
        if chunk_tokens < block_size or chunk_tokens % block_size:
            raise ConfigError(f"chunk_tokens={chunk_tokens}",
                              f"a chunk is whole blocks of {block_size} tokens",
                              f"use a multiple of {block_size}")
        self.rows = rows
        self.block_size, self.chunk_tokens = block_size, chunk_tokens
        self.blocks_per_chunk = chunk_tokens // block_size
        self.row_bytes = rows.shape[1]
        self.chunk_bytes = self.blocks_per_chunk * self.row_bytes
        self.tier = Tier(TierSpec("dram", capacity_bytes), self.chunk_bytes)
        cap = self.tier.capacity_chunks
        if cap < 1:
            raise ConfigError(f"capacity_bytes={capacity_bytes}",
                              f"holds no chunk of {self.chunk_bytes} bytes",
                              f"give the tier at least {self.chunk_bytes} bytes")
        self.pinned = rows.is_cuda if pin is None else pin
        self.store = torch.empty((cap, self.blocks_per_chunk, self.row_bytes), dtype=torch.uint8,
                                 pin_memory=self.pinned)
        self.slot: dict[int, int] = {}  # chunk key -> its slot in ``store``
        self._free = list(range(cap - 1, -1, -1))

    @property
    def capacity_chunks(self) -> int:
        return self.tier.capacity_chunks

    def __len__(self) -> int:
        return len(self.slot)

    def _span(self, keys: list[int], n_tokens: int, skip: int) -> tuple[int, int]:
        """Chunks ``first..end`` the tier can supply after ``skip`` tokens (one token is left)."""
        c = self.chunk_tokens
        limit = min(len(keys), (n_tokens - 1) // c)
        first = min(skip // c, limit)
        end = first
        while end < limit and keys[end] in self.slot:
            end += 1
        return first, end

    def lookup(self, tokens: Sequence[int], skip_tokens: int = 0) -> int:
        """Read-only: tokens beyond ``skip_tokens`` this tier can supply."""
        first, end = self._span(chunk_keys(tokens, self.chunk_tokens), len(tokens), skip_tokens)
        return max(end * self.chunk_tokens - skip_tokens, 0)

    def load(self, tokens: Sequence[int], skip_tokens: int, blocks: Sequence[int]) -> Load:
        """Copy the chunks after ``skip_tokens`` into ``blocks`` (the request's block table)."""
        t0 = time.perf_counter()
        if skip_tokens % self.block_size:
            raise ConfigError(f"skip_tokens={skip_tokens}", "the local hit is whole blocks",
                              f"pass a multiple of {self.block_size}")
        keys = chunk_keys(tokens, self.chunk_tokens)
        first, end = self._span(keys, len(tokens), skip_tokens)
        ld = Load(skip_tokens=skip_tokens, tokens=max(end * self.chunk_tokens - skip_tokens, 0),
                  chunks=end - first)
        need = (skip_tokens + ld.tokens) // self.block_size
        if len(blocks) < need:
            raise ConfigError(f"{len(blocks)} blocks", f"the load fills {need}",
                              "allocate the request's blocks before loading")
        t1 = time.perf_counter()
        ld.lookup_s = t1 - t0
        bpc, skip_b = self.blocks_per_chunk, skip_tokens // self.block_size
        for i in range(first, end):
            src = self.store[self.slot[keys[i]]]
            lo = max(i * bpc, skip_b)
            dst = blocks[lo:(i + 1) * bpc]
            for j, n in _runs(dst):
                self.rows[dst[j]:dst[j] + n].copy_(src[lo - i * bpc + j:lo - i * bpc + j + n],
                                                   non_blocking=self.pinned)
                ld.copies += 1
            ld.blocks += len(dst)
        ld.nbytes = ld.blocks * self.row_bytes
        self.tier.touch(keys[first:end])
        t2 = time.perf_counter()
        ld.copy_s = t2 - t1
        if self.rows.is_cuda:
            torch.cuda.synchronize(self.rows.device)
        ld.wait_s = time.perf_counter() - t2
        return ld

    def save(self, tokens: Sequence[int], blocks: Sequence[int]) -> Save:
        """Copy every full chunk of ``tokens`` (KV in ``blocks``) the tier lacks; the head of the
        chain first in priority: at most ``capacity_chunks`` chunks of it are kept."""
        t0 = time.perf_counter()
        keys = chunk_keys(tokens, self.chunk_tokens)[:self.capacity_chunks]
        keys = keys[:len(blocks) // self.blocks_per_chunk]
        sv = Save()
        bpc = self.blocks_per_chunk
        # chunks of this chain already here become most recent first, so making room for its
        # missing chunks never evicts (and then copies again) one of its own
        self.tier.touch([k for k in keys if k in self.slot])
        for i in reversed(range(len(keys))):  # tail first: the head ends most recent (LRU)
            k = keys[i]
            if k in self.slot:
                self.tier.touch([k])
                sv.touched += 1
                continue
            for gone in self.tier.put([k]):
                self._free.append(self.slot.pop(gone))
            s = self._free.pop()
            self.slot[k] = s
            src = blocks[i * bpc:(i + 1) * bpc]
            for j, n in _runs(src):
                self.store[s, j:j + n].copy_(self.rows[src[j]:src[j] + n],
                                             non_blocking=self.pinned)
            sv.chunks += 1
        sv.nbytes = sv.chunks * self.chunk_bytes
        if self.rows.is_cuda:
            torch.cuda.synchronize(self.rows.device)
        sv.seconds = time.perf_counter() - t0
        return sv

    def clear(self) -> None:
        self.tier.clear()
        self.slot.clear()
        self._free = list(range(self.capacity_chunks - 1, -1, -1))


class HostTierConnector:
    """The host tier as the vLLM-like scheduler's KV connector
    (:class:`workbench.engines.sched.vllm_sched.KVConnector`) on one mini engine; the engine
    calls :meth:`after_forward` so a prompt is saved once its prefill is in the KV."""

    def __init__(self, tier: HostTier):
        self.tier = tier
        self.loading = True  # False: lookups find nothing (the recompute control)
        self.saving = True
        self.loads: dict[str, Load] = {}  # request name -> its first load
        self.saves: dict[str, Save] = {}
        self._lookup_s: dict[int, float] = {}

    def lookup(self, req, local_tokens: int) -> int:
        if not self.loading:
            return 0
        t0 = time.perf_counter()
        n = self.tier.lookup(req.tokens, local_tokens)
        self._lookup_s[req.rid] = time.perf_counter() - t0
        return n

    def load(self, req, local_tokens: int, tokens: int) -> None:
        if not self.loading:
            return
        ld = self.tier.load(req.tokens, local_tokens, req.blocks)
        if ld.tokens != tokens:
            raise ConfigError(f"a load of {ld.tokens} tokens", f"the lookup promised {tokens}",
                              "do not change the tier between a lookup and its load")
        ld.lookup_s += self._lookup_s.pop(req.rid, 0.0)
        self.loads.setdefault(getattr(req, "name", str(req.rid)), ld)

    def after_forward(self, items: Sequence[tuple]) -> None:
        """Save each prompt whose prefill this forward finished (before the scheduler frees)."""
        if not self.saving:
            return
        for seq, n in items:
            if seq.num_computed < seq.prompt_len <= seq.num_computed + n:
                sv = self.tier.save(seq.tokens[:seq.prompt_len], seq.blocks)
                self.saves.setdefault(getattr(seq, "name", str(seq.rid)), sv)


def attach_host_tier(engine, capacity_bytes: int, chunk_tokens: int = 256) -> HostTierConnector:
    """Give ``engine`` (a :class:`workbench.mini.engine.Engine`, ``block`` style) a host tier."""
    kv = engine.kv
    tier = HostTier(kv.block_rows(), block_size=kv.block_size, chunk_tokens=chunk_tokens,
                    capacity_bytes=capacity_bytes)
    conn = HostTierConnector(tier)
    engine.scheduler.connector = conn
    engine.connector = conn
    return conn


__all__ = ["HostTier", "HostTierConnector", "Load", "Save", "attach_host_tier"]
