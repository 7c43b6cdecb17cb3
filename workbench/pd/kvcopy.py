"""Copy a request's KV blocks from one mini engine's store to another's (the real PD handover).

Three placements, one code path: engines on two GPUs (a device-to-device copy), on one GPU (a copy
within the device) and on the host backend (a host memory copy). The copy never touches the other
device's VMM memory directly: a gather on the source device packs the blocks of every layer's K
and V into one staging tensor (the caching allocator's memory, which peer copies handle), one
``.to()`` moves it, a scatter on the destination writes it into the blocks the decode engine
allocated. So each pool's mapped pages are only ever read or written by kernels of their own
device, and the peer copy is one transfer of the whole payload.

The copy is complete when :func:`copy_blocks` returns: an event recorded after the scatter (and
one after the gather) is waited on, so the caller may free the source blocks.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError
from workbench.mini.kv import KVStore


@dataclass(frozen=True, slots=True)
class CopyResult:
    blocks: int
    nbytes: int  # blocks x block bytes (every layer's K and V of one block)
    seconds: float  # gather + transfer + scatter, waited on
    placement: str  # "device-to-device", "within one device", "host"


def on_device(device: torch.device):
    """The context a CUDA engine's kernels need (Triton launches on the current device)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def placement(src: torch.device, dst: torch.device) -> str:
    if src.type == "cpu" and dst.type == "cpu":
        return "host"
    if src == dst:
        return "within one device"
    return "device-to-device"


def block_nbytes(kv: KVStore) -> int:
    """Bytes of one block across every layer and both buffers (what one block's copy moves)."""
    return kv.block_size * kv.cfg.kv_bytes_per_token


def check_compatible(src: KVStore, dst: KVStore) -> None:
    """Refuse a pair whose blocks do not mean the same thing (shape, block size, dtype)."""
    a, b = src.geometry, dst.geometry
    mine = (a.num_layers, a.kv_heads, a.head_dim, a.block_size, src.k[0].dtype)
    theirs = (b.num_layers, b.kv_heads, b.head_dim, b.block_size, dst.k[0].dtype)
    if mine != theirs:
        raise ConfigError("PD handover between these KV stores",
                          f"prefill blocks are {mine}, decode blocks {theirs} "
                          "(layers, kv heads, head dim, block size, dtype)",
                          "build both engines from the same model config and block size")


def _wait(device: torch.device) -> None:
    """Block until the work queued so far on ``device``'s current stream has run."""
    if device.type != "cuda":
        return
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    ev.synchronize()


def copy_blocks(src: KVStore, dst: KVStore, src_blocks: list[int],
                dst_blocks: list[int]) -> CopyResult:
    """Copy ``src_blocks`` of ``src`` into ``dst_blocks`` of ``dst`` (same order), all layers,
    K and V; returns after the copy has completed on both devices."""
    if len(src_blocks) != len(dst_blocks):
        raise ConfigError(f"{len(src_blocks)} source blocks for {len(dst_blocks)} destinations",
                          "a handover copies block for block",
                          "pass one destination block per source block")
    n = len(src_blocks)
    where = placement(src.device, dst.device)
    if n == 0:
        return CopyResult(0, 0, 0.0, where)
    t0 = time.perf_counter()
    layers = src.geometry.num_layers
    with on_device(src.device):
        idx = torch.tensor(src_blocks, dtype=torch.long, device=src.device)
        # [2 * layers, n, block_size, kv_heads, head_dim]: K of every layer, then V
        k0 = src.k[0]
        staged = torch.empty((2 * layers, n, *k0.shape[1:]), dtype=k0.dtype, device=src.device)
        for j, buf in enumerate((src.k, src.v)):
            for i in range(layers):
                torch.index_select(buf[i], 0, idx, out=staged[j * layers + i])
        moved = staged.to(dst.device)
        _wait(src.device)
    with on_device(dst.device):
        out = torch.tensor(dst_blocks, dtype=torch.long, device=dst.device)
        for j, buf in enumerate((dst.k, dst.v)):
            for i in range(layers):
                buf[i].index_copy_(0, out, moved[j * layers + i])
        _wait(dst.device)
    seconds = time.perf_counter() - t0
    return CopyResult(n, n * block_nbytes(src), seconds, where)
