"""What a layout costs in VMM calls: map and unmap a few page ids in each layout and time them.

The contiguous layout puts every layer's and buffer's slice of a block side by side, so a page id
is one compound range: one create + map + set access. The per-layer layout gives each layer and
buffer its own region, so the same page id is ``layers x buffers`` ranges and as many calls. The
simulated device charges its preset latency per call, so the gap shows in simulated time; on the
gpu backend ``busy_s`` is wall time inside the driver calls.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import plotly.graph_objects as go

from workbench.backends import make_device
from workbench.core.geometry import KVGeometry, Layout
from workbench.core.vspace import KVSpace
from workbench.viz.style import FONT, WHITE, pool_color


@dataclass(slots=True)
class LayoutCost:
    layout: str
    maps_per_page: int  # driver ranges behind one page id
    map_s: float  # seconds to back one page id (create + map + set access per range)
    unmap_s: float  # seconds to give one back (unmap + release per range)

    @property
    def total_s(self) -> float:
        return self.map_s + self.unmap_s


def layout_costs(geo: KVGeometry, *, pages: int = 4, backend: str = "sim",
                 **device_kw) -> list[LayoutCost]:
    """Map then unmap ``pages`` page ids in the contiguous and the per-layer layout, each on a
    fresh device; the device's ``busy_s`` before and after gives the time per page id."""
    out = []
    for layout in (Layout.CONTIGUOUS, Layout.PER_LAYER):
        dev = make_device(backend, **device_kw)
        space = KVSpace(replace(geo, layout=layout), dev)
        t0 = dev.busy_s
        for p in range(pages):
            space.map_page(p)
        t1 = dev.busy_s
        for p in range(pages):
            space.unmap_page(p)
        t2 = dev.busy_s
        ranges = len(space.targets(0))
        space.close()
        out.append(LayoutCost(layout.value, ranges, (t1 - t0) / pages, (t2 - t1) / pages))
    return out


def layout_figure(costs: list[LayoutCost], title: str = "Time per page id, by layout"):
    """Stacked bars: map and unmap time per page id (µs) for each layout."""
    names = [f"{c.layout}<br>({c.maps_per_page} range(s))" for c in costs]
    fig = go.Figure([
        go.Bar(x=names, y=[c.map_s * 1e6 for c in costs], name="map", marker_color=pool_color(0),
               text=[f"{c.map_s * 1e6:,.0f} µs" for c in costs], textposition="inside"),
        go.Bar(x=names, y=[c.unmap_s * 1e6 for c in costs], name="unmap",
               marker_color=pool_color(1),
               text=[f"{c.unmap_s * 1e6:,.0f} µs" for c in costs], textposition="inside")])
    fig.update_layout(barmode="stack", title=title, font=FONT, height=360, plot_bgcolor=WHITE,
                      yaxis=dict(title="µs per page id"), margin=dict(l=60, r=10, t=50, b=60))
    return fig
