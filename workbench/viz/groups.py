"""Chapter 09: more than one KV group. The per-layer block arithmetic of MHA/GQA, MLA, sliding
window and Mamba-style state layers; unifying their page sizes so one block pool serves every
group; and a decode run in which full-attention and sliding-window groups share one elastic pool.

Attention geometry comes from :class:`~workbench.core.geometry.KVGeometry` (MHA/GQA: K and V
buffers; MLA: one latent buffer). A Mamba-style layer keeps a fixed state per request instead of
per-token KV, so its "block" is one state cell whatever the sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import plotly.graph_objects as go

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.geometry import DEFAULT_PAGE_SIZE, KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.engines.sched.block_pool import BlockPool, hash_chain
from workbench.errors import ConfigError
from workbench.units import GiB
from workbench.viz.style import FONT, RULE, WHITE, pool_color
from workbench.viz.trace import Recording

KINDS = ("full", "sliding", "mla", "mamba")


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One kind of layer of a model: how many there are and what each caches."""

    name: str
    kind: str  # full | sliding | mla | mamba
    num_layers: int
    kv_heads: int = 0
    head_dim: int = 0  # MLA: kv_lora_rank + rope dim
    block_size: int = 16
    dtype_bytes: int = 2
    window: int | None = None  # sliding: tokens each new token attends to (itself included)
    state_shapes: tuple[tuple[int, ...], ...] = ()  # mamba: per request per layer
    state_dtype_bytes: tuple[int, ...] = ()
    padded_bytes: int | None = None  # a state cell padded up to a shared page

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"layer kind {self.kind!r}", "is not known", f"use one of {KINDS}")
        if self.kind == "sliding" and not (self.window and self.window > 0):
            raise ConfigError(f"sliding layer {self.name!r}", "has no window",
                              "pass window=<tokens>")
        if self.kind == "mamba" and len(self.state_shapes) != len(self.state_dtype_bytes):
            raise ConfigError(f"mamba layer {self.name!r}", "needs one dtype size per state",
                              "pass state_dtype_bytes with one entry per state shape")

    def geometry(self, num_blocks: int = 2) -> KVGeometry:
        """The attention geometry (MLA: one latent buffer); a Mamba layer has none."""
        if self.kind == "mamba":
            raise ConfigError(f"layer {self.name!r}", "keeps a state, not per-token KV",
                              "use block_bytes for its state cell")
        return KVGeometry.for_model(num_layers=self.num_layers, kv_heads=self.kv_heads,
                                    head_dim=self.head_dim, mla=self.kind == "mla",
                                    block_size=self.block_size, num_blocks=num_blocks,
                                    dtype_bytes=self.dtype_bytes, page_size=GiB)

    @property
    def state_bytes(self) -> int:
        return sum(prod(s) * b for s, b in zip(self.state_shapes, self.state_dtype_bytes,
                                               strict=True))

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in one layer, all buffers (vLLM's ``page_size_bytes``)."""
        if self.kind == "mamba":
            return self.padded_bytes or self.state_bytes
        g = self.geometry()
        return g.block_bytes * g.num_buffers

    def blocks_held(self, tokens: int) -> int:
        """Blocks one request holds in this group after ``tokens`` computed tokens."""
        if self.kind == "mamba":
            return 1
        allocated = -(-tokens // self.block_size)
        if self.kind != "sliding":
            return allocated
        return allocated - skipped_blocks(tokens, self.window, self.block_size)


def skipped_blocks(tokens: int, window: int, block_size: int) -> int:
    """Leading blocks no new token can attend to any more: the first useful token is
    ``tokens - window + 1`` (the new token itself is inside its window)."""
    return max(0, tokens - window + 1) // block_size


def unify(specs: list[LayerSpec]) -> list[LayerSpec]:
    """One block size in bytes for every group: smaller attention blocks take more tokens
    (an integer multiple), smaller state cells are padded; otherwise refuse."""
    target = max(s.block_bytes for s in specs)
    out = []
    for s in specs:
        b = s.block_bytes
        if b == target:
            out.append(s)
        elif s.kind == "mamba":
            out.append(replace(s, padded_bytes=target))
        elif target % b:
            raise ConfigError(f"group {s.name!r} with {b}-byte blocks",
                              f"cannot grow to {target} bytes by a whole number of tokens",
                              "pick block sizes whose per-layer bytes divide each other")
        else:
            out.append(replace(s, block_size=s.block_size * (target // b)))
    return out


def arithmetic(specs: list[LayerSpec], tokens: int,
               page_size: int = DEFAULT_PAGE_SIZE) -> list[dict]:
    """Per group: bytes per block per layer, blocks per VMM page, what one request of ``tokens``
    holds, and that in bytes over all the group's layers."""
    rows = []
    for s in specs:
        held = s.blocks_held(tokens)
        rows.append({"group": s.name, "kind": s.kind, "layers": s.num_layers,
                     "tokens/block": 0 if s.kind == "mamba" else s.block_size,
                     "block bytes/layer": s.block_bytes,
                     "blocks/VMM page": page_size // s.block_bytes,
                     "blocks held": held,
                     "MiB held": round(held * s.block_bytes * s.num_layers / 2**20, 2)})
    return rows


def arithmetic_figure(rows: list[dict], title: str = "What one request holds") -> go.Figure:
    fig = go.Figure(go.Bar(x=[r["group"] for r in rows], y=[r["MiB held"] for r in rows],
                           marker_color=[pool_color(i) for i in range(len(rows))],
                           text=[f"{r['blocks held']} blocks × {r['layers']} layers"
                                 for r in rows], textposition="outside",
                           hovertemplate="%{x}: %{y} MiB<extra></extra>"))
    fig.update_layout(title=title, font=FONT, height=360, plot_bgcolor=WHITE,
                      yaxis=dict(title="MiB (all layers of the group)", rangemode="tozero"),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig


# -- one pool, several groups ----------------------------------------------------------------
@dataclass(slots=True)
class HybridRun:
    rec: Recording
    pool: BlockPool
    held: dict[str, list[list[int]]]  # group -> per step, blocks held (all requests)
    owner: list[str | None]  # final: the group holding each block, "cached", or None (free)
    keys: list[tuple[int, int]]  # cache keys of the prompt's first full block, per group
    tokens: list[int]  # computed tokens per request after each step


def hybrid_decode(groups: list[LayerSpec], *, requests: int = 3, prompt: int = 96,
                  steps: int = 12, tokens_per_step: int = 16, num_blocks: int = 256,
                  max_cached_tokens: int = -1, backend: str = "sim") -> HybridRun:
    """``requests`` requests prefill ``prompt`` tokens, then decode ``tokens_per_step`` tokens
    per step; every group allocates its blocks from ONE pool; a sliding group frees the blocks
    that left its window; full blocks are cached under ``(hash, group id)``."""
    if any(g.kind == "mamba" for g in groups):
        raise ConfigError("a Mamba group in hybrid_decode", "this run models attention groups",
                          "use arithmetic() for state layers")
    groups = unify(groups)
    # the pool: one tensor per layer position of a group (vLLM shares each among the groups),
    # blocks of the unified size; any group's geometry gives that size after unify()
    geo = replace(groups[0].geometry(num_blocks), page_size=DEFAULT_PAGE_SIZE,
                  num_layers=max(g.num_layers for g in groups))
    rec = Recording()
    cfg = PoolConfig(min_reserved_pages=0, max_reserved_pages=0,  # mapped = what blocks need
                     max_cached_tokens=max_cached_tokens)
    kv = KVCacheManager(geo, make_device(backend), name="hybrid", events=rec.log, config=cfg)
    rec.add_pool(kv)
    pool = BlockPool(kv)
    tables = {g.name: [[] for _ in range(requests)] for g in groups}
    held: dict[str, list[int]] = {g.name: [] for g in groups}
    seqs = [[r * 1000 + t for t in range(prompt)] for r in range(requests)]
    lens = [0] * requests
    for step in range(steps + 1):
        n = prompt if step == 0 else tokens_per_step
        for r in range(requests):
            lens[r] += n
            for gi, g in enumerate(groups):
                _grow(pool, g, tables[g.name][r], lens[r])
                if step == 0:  # the prompt's full blocks enter the prefix cache, per group
                    hashes = hash_chain(seqs[r], g.block_size)
                    pool.cache_full_blocks(tables[g.name][r], hashes, 0, len(hashes), gi)
                if g.kind == "sliding":
                    _drop_skipped(pool, g, tables[g.name][r], lens[r])
        for g in groups:
            held[g.name].append(sum(1 for t in tables[g.name] for b in t if b is not None))
        rec.mark("prefill" if step == 0 else f"decode {step}")
    owner: list[str | None] = [None] * num_blocks
    for b in pool.evictable:
        owner[b] = "cached"
    for g in groups:
        for t in tables[g.name]:
            for b in t:
                if b is not None:
                    owner[b] = g.name
    first = hash_chain(seqs[0], groups[0].block_size)[0]
    keys = [k for k in pool.cached if k[0] == first]
    return HybridRun(rec, pool, held, owner, keys, list(lens))


def _grow(pool: BlockPool, g: LayerSpec, table: list[int | None], tokens: int) -> None:
    """Give ``table`` enough blocks for ``tokens`` (all or nothing, like the ledger)."""
    need = -(-tokens // g.block_size) - len(table)
    if need > 0:
        ids = pool.get_new_blocks(need)
        if ids is None:
            raise ConfigError(f"group {g.name!r}", f"the pool has no {need} free blocks",
                              "raise num_blocks or run fewer requests")
        table.extend(ids)


def _drop_skipped(pool: BlockPool, g: LayerSpec, table: list[int | None], tokens: int) -> None:
    """Free the blocks no token can attend to any more; their table entries become the null
    block (None here), as vLLM's sliding-window manager does."""
    skip = skipped_blocks(tokens, g.window, g.block_size)
    gone = [table[i] for i in range(skip) if table[i] is not None]
    table[:skip] = [None] * skip
    pool.free_blocks(reversed(gone))


def held_figure(run: HybridRun, title: str = "Blocks held per group") -> go.Figure:
    fig = go.Figure()
    for i, (name, xs) in enumerate(run.held.items()):
        fig.add_scatter(x=run.rec.labels(), y=xs, name=name, mode="lines+markers",
                        line=dict(color=pool_color(i), width=2))
    fig.update_layout(title=title, font=FONT, height=340, plot_bgcolor=WHITE,
                      yaxis=dict(title="blocks (all requests)", rangemode="tozero"),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig


def owner_figure(run: HybridRun, title: str = "Which group holds each block") -> go.Figure:
    """Blocks in rows of one VMM page each; a colour per group, grey for cached blocks no
    request holds, white for free blocks. Block 0 is the null block."""
    per_page = run.pool.geometry.blocks_per_page(1)
    names = [*run.held, "cached"]
    code = {None: 0} | {n: i + 1 for i, n in enumerate(names)}
    n = len(names) + 1
    colors = [WHITE] + [pool_color(i) for i in range(len(names) - 1)] + [RULE]
    scale = [pt for k, c in enumerate(colors) for pt in ([k / n, c], [(k + 1) / n, c])]
    rows = [run.owner[i:i + per_page] for i in range(0, len(run.owner), per_page)]
    fig = go.Figure(go.Heatmap(z=[[code[o] for o in r] for r in rows],
                               text=[[o or "free" for o in r] for r in rows],
                               hovertemplate="page %{y}, block %{x}: %{text}<extra></extra>",
                               zmin=-0.5, zmax=n - 0.5, colorscale=scale, showscale=False,
                               xgap=1, ygap=2))
    fig.update_layout(title=title, font=FONT, height=120 + 28 * len(rows),
                      xaxis=dict(title="block within the page"),
                      yaxis=dict(title="VMM page", autorange="reversed"),
                      margin=dict(l=60, r=10, t=50, b=40))
    return fig
