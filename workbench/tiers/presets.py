"""Default tier costs: assumptions of the right order, not measurements (calibrate them).

* pinned host DRAM: an in-process hash lookup (~20 us); data already in host memory, so a
  retrieve is only the host-to-device copy, at ``pcie_bw`` (25 GB/s: a PCIe Gen4 x16 link moves
  about that much from pinned memory; Gen5 about twice);
* remote store: one metadata request costs ``meta_s`` (an RPC to the master over a data-centre
  network, ~0.3 ms); payload moves at ``remote_bw`` (5 GB/s: a TCP-class path; an RDMA path is
  several times faster) plus ``remote_op_s`` per chunk; retrieved chunks land in host memory and
  still pay the host-to-device copy.

``PRESETS`` names the cost sets: ``assumed`` (the defaults above) and ``h200-measured``, whose
host-to-device bandwidth, per-chunk copy overhead and DRAM lookup were measured on the mini engine
(``workbench bench crossover``, :data:`H200_PROVENANCE` says what ran where and when); its remote
store costs stay the assumed ones (nothing measured a store).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workbench.engines.models import get_model
from workbench.errors import ConfigError
from workbench.tiers.model import RemoteStore, Tier, TierSpec, TierStack
from workbench.units import GiB


@dataclass(frozen=True, slots=True)
class TierCosts:
    chunk_tokens: int = 256  # LMCache's documented default chunk size
    hbm_bytes: int = 0  # 0: the engine's own prefix cache plays HBM (no tier in the stack)
    dram_bytes: int = 64 * GiB
    remote_bytes: int = 1024 * GiB
    dram_lookup_s: float = 20e-6
    meta_s: float = 300e-6
    meta_batch: int = 0  # keys per metadata request (0: one request per lookup)
    remote_bw: float = 5e9
    remote_op_s: float = 20e-6
    pcie_bw: float = 25e9
    pcie_op_s: float = 5e-6


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a measured preset's numbers came from."""

    command: str
    date: str
    device: str
    measured: tuple[str, ...]  # the TierCosts fields set from the measurement
    assumed: tuple[str, ...]  # the rest: still assumptions
    recompute_s_per_token: float  # the 8B shape's prefill on the same device (least squares)
    notes: str = ""


H200_PROVENANCE = Provenance(
    command="workbench bench crossover --backend gpu --repeats 3 (llama-3.1-8b shape, lens "
            "256,1024,4096,8192, chunks 256,1024, concurrency 1,4,16, cells <= 32768 tokens)",
    date="2026-12-01", device="NVIDIA H200 (driver 580.159.04, PCIe gen 5 x16), pinned host "
                              "memory into VMM-backed KV",
    measured=("pcie_bw", "pcie_op_s", "dram_lookup_s"),
    assumed=("dram_bytes", "remote_bytes", "meta_s", "meta_batch", "remote_bw", "remote_op_s"),
    recompute_s_per_token=41.3e-6,
    notes="pcie_bw and pcie_op_s: least squares of the medians of copy + wait on bytes and "
          "chunks over the 11 cells that moved KV (54.6 GB/s, 9.7 us per chunk; the cells' "
          "medians ranged 50.3-54.7 GB/s). dram_lookup_s: the median lookup of one 4096-token "
          "prompt in 256-token chunks (hashing the chain: it grows with the prompt). "
          "recompute_s_per_token: least squares of the recompute medians on k * n tokens.")

PRESETS: dict[str, tuple[TierCosts, Provenance | None]] = {
    "assumed": (TierCosts(), None),
    "h200-measured": (replace(TierCosts(), pcie_bw=54.6e9, pcie_op_s=9.7e-6,
                              dram_lookup_s=109e-6), H200_PROVENANCE),
}


def tier_costs(name: str = "assumed") -> TierCosts:
    """The cost set ``name`` (``PRESETS``)."""
    if name not in PRESETS:
        raise ConfigError(f"tier cost preset {name!r}", "is not defined",
                          f"use one of {', '.join(PRESETS)}")
    return PRESETS[name][0]


def make_store(model: str, c: TierCosts) -> RemoteStore:
    kvb = get_model(model).kv_bytes_per_token
    spec = TierSpec("remote", c.remote_bytes, lookup_s=c.meta_s, read_bw=c.remote_bw,
                    write_bw=c.remote_bw, op_s=c.remote_op_s, batch_keys=c.meta_batch)
    return RemoteStore(spec, c.chunk_tokens * kvb)


def make_stack(model: str, c: TierCosts, *, store: RemoteStore | None = None,
               owner: str = "engine", dram: bool = True, remote: bool = True) -> TierStack:
    """HBM (if ``hbm_bytes``), DRAM and the remote store (``store``: shared by instances)."""
    kvb = get_model(model).kv_bytes_per_token
    cb = c.chunk_tokens * kvb
    tiers: list[Tier] = []
    if c.hbm_bytes:
        tiers.append(Tier(TierSpec("hbm", c.hbm_bytes, on_device=True), cb))
    if dram:
        tiers.append(Tier(TierSpec("dram", c.dram_bytes, lookup_s=c.dram_lookup_s), cb))
    if remote:
        tiers.append(store if store is not None else make_store(model, c))
    return TierStack(tiers, chunk_tokens=c.chunk_tokens, kv_bytes_per_token=kvb,
                     pcie_bw=c.pcie_bw, pcie_op_s=c.pcie_op_s, owner=owner)
