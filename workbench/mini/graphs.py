"""CUDA graphs for the mini engine's decode steps: one captured forward per batch size.

An eager decode step of an 8B model launches ~600 kernels from Python; the host's jitter in doing
so was larger than any VMM/static difference. A graph replays the whole forward with one launch.
As vLLM does, a set of batch sizes is captured when the engine is built (largest first, so the
smaller graphs reuse its memory pool) and a batch is padded up to the next captured size. Each
step copies its inputs (token ids, positions, write slots, lengths, rows of the persistent device
table, :mod:`workbench.mini.req_to_token`) into static device buffers, then replays.

Why replay is safe across page maps: a graph holds raw addresses, and the KV's never change. The
VMM pool reserves its whole virtual range when the store is built and maps or unmaps physical
pages *under* those fixed addresses; static KV is one allocation. A replay only touches slots its
inputs name: lengths mask every table entry past a sequence's end, and padding rows (length 1,
slot 0) write and read only the null block (block 0), which the ledger keeps mapped. Capture
refuses a store whose K/V views are not all inside its one fixed range, or have moved since the
graphs were built.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError
from workbench.mini.attention import AttnContext, triton_available
from workbench.mini.kv import KVStore
from workbench.mini.req_to_token import ReqToToken

# rows of the packed static input buffer
IDS, POS, WSLOT, LENS, ROWS = range(5)


def capture_sizes(max_batch: int) -> tuple[int, ...]:
    """vLLM-like: 1, 2, 4, 8, then every 16 up to ``max_batch`` (and ``max_batch`` itself)."""
    sizes = {s for s in (1, 2, 4, 8) if s <= max_batch}
    sizes.update(range(16, max_batch + 1, 16))
    sizes.add(max_batch)
    return tuple(sorted(sizes))


@dataclass(slots=True)
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # the graph's output buffer, [size, vocab]


class DecodeGraphs:
    """Captured decode forwards of one engine's model over one KV store."""

    def __init__(self, model: torch.nn.Module, kv: KVStore, *, sizes: Sequence[int],
                 scale: float, impl: str, r2t: ReqToToken):
        if kv.device.type != "cuda":
            raise ConfigError(f"cuda_graphs=True on {kv.device}", "CUDA graphs need a CUDA device",
                              "leave cuda_graphs unset (None) or False off CUDA")
        if not sizes or min(sizes) < 1:
            raise ConfigError(f"graph sizes {tuple(sizes)}", "need batch sizes of 1 or more",
                              "pass positive sizes or leave graph_sizes empty")
        self.model, self.kv, self.r2t = model, kv, r2t
        self.scale, self.impl = scale, impl
        self.sizes = tuple(sorted(set(sizes)))
        self.enabled = True  # benches switch graphs off and on for the same engine
        bmax, dev = self.sizes[-1], kv.device
        self._inp = torch.zeros(5, bmax, dtype=torch.long, device=dev)
        self._addresses = self._kv_addresses()
        self._graphs: dict[int, _Captured] = {}
        self._pool = None
        self.replays = 0

    # -- addresses -------------------------------------------------------------------------------
    def _kv_addresses(self) -> tuple[int, ...]:
        kv = self.kv
        if not kv.k or kv._flat is None:
            raise ConfigError("capturing a decode graph", "the KV store is closed",
                              "build a new engine")
        lo, hi = kv._flat.data_ptr(), kv._flat.data_ptr() + kv._flat.numel()
        views = (*kv.k, *kv.v)
        if any(not lo <= t.data_ptr() < hi for t in views):
            raise ConfigError("capturing a decode graph", "a K/V view lies outside the store's "
                              "one fixed range, so its address could move", "lay every K/V "
                              "view over the store's reserved range (KVTensors)")
        return tuple(t.data_ptr() for t in views)

    def _check_fixed(self) -> None:
        if self._kv_addresses() != self._addresses:
            raise ConfigError("capturing a decode graph", "the K/V tensors moved since the "
                              "graphs were built (a graph keeps raw addresses)",
                              "build a new engine (and its graphs) over the new KV")

    # -- stepping --------------------------------------------------------------------------------
    def size_for(self, batch: int) -> int | None:
        i = bisect.bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None

    def fits(self, items: Sequence[tuple[object, int]], is_decode: Callable) -> bool:
        return (self.enabled and self.size_for(len(items)) is not None
                and all(is_decode(s, n) for s, n in items))

    def run(self, items: Sequence[tuple[object, int]], slot: Callable, rows: list[int]
            ) -> torch.Tensor:
        """Logits ``[len(items), vocab]`` of a decode-only step (every item is one new token)."""
        b = len(items)
        size = self.size_for(b)
        if not self.kv.k:
            raise ConfigError("replaying a decode graph", "the KV store is closed",
                              "build a new engine")
        cap = self._graphs.get(size) or self._capture(size)
        pad = size - b
        ids, pos, ws, lens = [], [], [], []
        for seq, _ in items:
            c = seq.num_computed
            ids.append(seq.tokens[c])
            pos.append(c)
            ws.append(slot(seq, c))
            lens.append(c + 1)
        host = torch.tensor([ids + [0] * pad, pos + [0] * pad, ws + [0] * pad, lens + [1] * pad,
                             rows + [self.r2t.pad_row] * pad], dtype=torch.long)
        self._inp[:, :size].copy_(host)
        cap.graph.replay()
        self.replays += 1
        return cap.logits[:b]

    def _forward(self, size: int) -> torch.Tensor:
        inp = self._inp[:, :size]
        kv = self.kv
        ctx = AttnContext(kv.k, kv.v, inp[WSLOT], size, self.r2t.table, inp[LENS],
                          kv.entry_tokens, [], self.scale, self.impl, rows=inp[ROWS])
        return self.model(inp[IDS], inp[POS], ctx)

    def _capture(self, size: int) -> _Captured:
        self._check_fixed()
        # padding inputs while warming up and capturing: only the null block is touched
        self._inp[:, :size] = 0
        self._inp[LENS, :size] = 1
        self._inp[ROWS, :size] = self.r2t.pad_row
        side = torch.cuda.Stream(self.kv.device)
        side.wait_stream(torch.cuda.current_stream(self.kv.device))
        with torch.cuda.stream(side):  # compile kernels, pick cuBLAS algorithms, off-graph
            for _ in range(2):
                self._forward(size)
        torch.cuda.current_stream(self.kv.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a background mapper may call the driver while this thread captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self._forward(size)
        self._pool = graph.pool()
        self._graphs[size] = cap = _Captured(graph, logits)
        return cap

    def capture_all(self) -> None:
        for size in reversed(self.sizes):
            if size not in self._graphs:
                self._capture(size)

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))


def graphs_for(cuda_graphs: bool | None, sizes: Sequence[int], max_num_seqs: int,
               model: torch.nn.Module, kv: KVStore, *, scale: float, impl: str,
               r2t: ReqToToken) -> DecodeGraphs | None:
    """The engine's decode graphs: ``None`` = on where the device is CUDA and the attention is
    Triton; ``True`` refuses (one line) anywhere else; ``False`` = none."""
    kernel = impl != "torch" and triton_available(kv.device)
    if cuda_graphs is None:
        cuda_graphs = kernel
    if not cuda_graphs:
        return None
    if kv.device.type == "cuda" and not kernel:  # the torch path syncs on lengths
        raise ConfigError(f"cuda_graphs=True with attn_impl={impl!r}", "only the Triton decode "
                          "kernel can be captured", "use attn_impl='auto' or 'triton'")
    graphs = DecodeGraphs(model, kv, sizes=sizes or capture_sizes(max_num_seqs), scale=scale,
                          impl=impl, r2t=r2t)
    graphs.capture_all()  # at build time: no capture pause on the request path
    return graphs
