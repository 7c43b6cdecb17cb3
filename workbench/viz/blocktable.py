"""One request seen three ways: its token positions, the engine's table, the VMM pages behind it.

vLLM view: the block table maps logical block i (tokens ``i*bs .. i*bs+bs-1``) to a block id.
SGLang view: ``req_to_token`` maps each token position to a token slot (with a paged allocator the
slots of one SGLang page are ``block*bs .. block*bs+bs-1``). Either way the pool's geometry puts
that block on VMM page ``block_bytes * block // page_size`` — the unit the workbench backs.
"""

from __future__ import annotations

from typing import NamedTuple

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.core.geometry import KVGeometry
from workbench.errors import ConfigError
from workbench.units import GiB
from workbench.viz.style import EDGE, FONT, TINTS, WHITE, page_color


class Span(NamedTuple):
    lane: int
    start: int  # first token position
    stop: int  # one past the last
    label: str
    color: str
    hover: str


def _block_lane(i: int, b: int, bs: int, lo: int, hi: int) -> Span:
    return Span(1, lo, hi, f"b{b}", TINTS["sky"], f"block_table[{i}] = block {b}")


def _slot_lane(i: int, b: int, bs: int, lo: int, hi: int) -> Span:
    s0 = b * bs  # the box shows the first slot; the hover gives the whole run
    return Span(1, lo, hi, f"{s0}…", TINTS["violet"],
                f"req_to_token[{lo}:{hi}] = slots {s0}–{s0 + hi - lo - 1}")


# the middle lane as each engine sees a block: vLLM's block table, SGLang's token slots
VIEWS = {"vllm": _block_lane, "sglang": _slot_lane}

def request_spans(geo: KVGeometry, block_ids: list[int], num_tokens: int,
                  view: str = "vllm") -> list[Span]:
    """The boxes of the three lanes for one request."""
    if view not in VIEWS:
        raise ConfigError(f"view {view!r}", "the block table is drawn as vLLM or SGLang sees it",
                          "use view='vllm' or view='sglang'")
    bs = geo.block_size
    need = -(-num_tokens // bs)
    if len(block_ids) < need:
        raise ConfigError(f"{num_tokens} tokens", f"they need {need} blocks of {bs}, got "
                          f"{len(block_ids)}", "pass a block id for every block the tokens fill")
    pages = {geo.block_page(b) for b in block_ids[:need]}
    shade = {p: page_color(i) for i, p in enumerate(sorted(pages))}
    spans: list[Span] = []
    for i, b in enumerate(block_ids[:need]):
        lo, hi = i * bs, min((i + 1) * bs, num_tokens)
        page = geo.block_page(b)
        spans.append(Span(0, lo, hi, f"L{i}", TINTS["grey"],
                          f"logical block {i}: token positions {lo}–{hi - 1}"))
        spans.append(VIEWS[view](i, b, bs, lo, hi))
        spans.append(Span(2, lo, hi, f"p{page}", shade[page],
                          f"block {b} lives on VMM page {page} "
                          f"(page holds blocks {geo.page_blocks(page).start}–"
                          f"{geo.page_blocks(page).stop - 1})"))
    return spans


LANES = {"vllm": ("request tokens", "block table → block id", "VMM page id"),
         "sglang": ("request tokens", "req_to_token → token slots", "VMM page id")}


PLOT_PX = 600  # the narrowest plot area a notebook gives this figure (the layout is responsive)
CHAR_PX = 6.5  # width of one character at the label font (10 px)
GAP_PX = 4.0


def visible_labels(spans: list[Span], num_tokens: int, plot_px: float = PLOT_PX) -> list[str]:
    """The label each box shows ("" where it would touch its left neighbour's): left to right, a
    label is drawn only if it clears the last drawn one; every box keeps its hover text."""
    px = plot_px / max(1, num_tokens)
    out, right = [], float("-inf")
    for s in spans:
        centre, half = (s.start + s.stop) / 2 * px, len(s.label) * CHAR_PX / 2
        if centre - half >= right + GAP_PX:
            out.append(s.label)
            right = centre + half
        else:
            out.append("")
    return out


def _add(fig, spans: list[Span], row: int, view: str) -> None:
    xs, ys, texts, hovers = [], [], [], []
    num_tokens = max(s.stop for s in spans)
    shown = {}
    for lane in (0, 1, 2):
        lane_spans = [s for s in spans if s.lane == lane]
        shown.update(zip(map(id, lane_spans), visible_labels(lane_spans, num_tokens),
                         strict=True))
    for s in spans:
        y = 2 - s.lane
        fig.add_shape(type="rect", x0=s.start, x1=s.stop, y0=y - 0.38, y1=y + 0.38,
                      fillcolor=s.color, line=dict(color=EDGE, width=1), layer="below",
                      row=row, col=1)
        xs.append((s.start + s.stop) / 2)
        ys.append(y)
        texts.append(shown[id(s)])
        hovers.append(s.hover)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="text", text=texts, hovertext=hovers,
                             hoverinfo="text", textfont=dict(size=10), showlegend=False,
                             name=view), row=row, col=1)
    fig.update_yaxes(tickmode="array", tickvals=[2, 1, 0], ticktext=list(LANES[view]),
                     range=[-0.6, 2.6], showgrid=False, zeroline=False, row=row, col=1)


def block_table_figure(geo: KVGeometry, block_ids: list[int], num_tokens: int,
                       views: tuple[str, ...] = ("vllm", "sglang"),
                       title: str | None = None) -> go.Figure:
    """Lanes per view (vLLM block table, SGLang req_to_token), aligned on token position."""
    fig = make_subplots(rows=len(views), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{v} view" for v in views])
    for r, v in enumerate(views, 1):
        _add(fig, request_spans(geo, block_ids, num_tokens, v), r, v)
    npages = len({geo.block_page(b) for b in block_ids[: -(-num_tokens // geo.block_size)]})
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="token position in the request", row=len(views), col=1)
    fig.update_layout(
        title=title or (f"One request: {num_tokens} tokens → "
                        f"{-(-num_tokens // geo.block_size)} blocks of {geo.block_size} → "
                        f"{npages} VMM page(s)"),
        font=FONT, height=200 + 190 * len(views), margin=dict(l=170, r=10, t=70, b=40),
        plot_bgcolor=WHITE)
    return fig


def describe_geometry(geo: KVGeometry) -> str:
    """The arithmetic of one geometry, one line per quantity."""
    per_page = geo.page_size // geo.block_bytes
    return "\n".join([
        f"token slot      {geo.token_bytes:>12,} B per layer per buffer "
        f"({geo.kv_heads} heads x {geo.head_dim} dims x {geo.dtype_bytes} B)",
        f"block           {geo.block_bytes:>12,} B = {geo.block_size} token slots",
        f"VMM page        {geo.page_size:>12,} B = {per_page} blocks = "
        f"{per_page * geo.block_size} tokens",
        f"page id         {geo.page_id_bytes:>12,} B across {geo.num_layers} layers x "
        f"{geo.num_buffers} buffer(s)",
        f"maps per page   {geo.maps_per_page:>12} ({geo.layout.value} layout)",
        f"pool            {geo.num_blocks:,} blocks on {geo.num_pages} page ids = "
        f"{geo.virtual_bytes / GiB:.2f} GiB virtual",
    ])


def offsets_table(space, block: int, layers: tuple[int, ...] = (0, 1)) -> str:
    """Byte offsets (from the reservation's base) of ``block`` in a few layers and buffers, and
    the ranges a page id maps: how the layout turns a block id into addresses."""
    g = space.geometry
    rows = [f"{g.layout.value} layout, block {block} (page {g.block_page(block)}):"]
    for layer in layers:
        for buf in range(g.num_buffers):
            off = space.block_address(layer, buf, block) - space.base
            rows.append(f"  layer {layer} {'KV'[buf] if g.num_buffers == 2 else 'latent'}: "
                        f"offset {off:>14,}")
    targets = space.targets(g.block_page(block))
    rows.append(f"  page id {g.block_page(block)} is {len(targets)} mapped range(s); first "
                f"{targets[0].size:,} B at offset {targets[0].va - space.base:,}")
    return "\n".join(rows)


def block_table_explorer(run, *, num_tokens: int = 300, block_size: int = 16,
                         live: bool | None = None):
    """A block-table figure with a token slider and a block-size picker (live), or the static
    figure. ``run(num_tokens, block_size=...)`` returns ``(kv, block_ids, recording)``."""
    from workbench.viz.live import figure, is_live

    live = is_live() if live is None else live
    kv, ids, _ = run(num_tokens, block_size=block_size)
    fig = figure(block_table_figure(kv.geometry, ids, num_tokens), live=live)
    if not live:
        return fig
    import ipywidgets as w

    tokens = w.IntSlider(value=num_tokens, min=1, max=800, step=1, description="tokens",
                         continuous_update=False)
    bs = w.Dropdown(options=[8, 16, 32, 64], value=block_size, description="block size")

    def redraw(_change=None) -> None:
        kv2, ids2, _ = run(tokens.value, block_size=bs.value)
        new = block_table_figure(kv2.geometry, ids2, tokens.value)
        with fig.batch_update():
            fig.data = []
            fig.add_traces(list(new.data))
            fig.layout = new.layout

    tokens.observe(redraw, names="value")
    bs.observe(redraw, names="value")
    box = w.VBox([w.HBox([tokens, bs]), fig])
    box.add_class("wb-blocktable")
    return box
