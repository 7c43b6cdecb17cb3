"""Scenario controls from a compact spec: ``sliders(load=(6, 1, 12), steps=40)``.

A tuple ``(value, min, max[, step])`` becomes an IntSlider (FloatSlider if any part is a float)
when live, and just ``value`` when static; anything else is passed through as a constant.
"""

from __future__ import annotations

from typing import Any

from workbench.viz.live import is_live


def sliders(live: bool | None = None, **spec: Any) -> dict[str, Any]:
    live = is_live() if live is None else live
    out: dict[str, Any] = {}
    for name, v in spec.items():
        if not (isinstance(v, tuple) and len(v) in (3, 4)):
            out[name] = v
            continue
        if not live:
            out[name] = v[0]
            continue
        import ipywidgets as w

        cls = w.FloatSlider if any(isinstance(x, float) for x in v) else w.IntSlider
        kw = dict(value=v[0], min=v[1], max=v[2], description=name.replace("_", " "),
                  continuous_update=False, style={"description_width": "initial"})
        if len(v) == 4:
            kw["step"] = v[3]
        out[name] = cls(**kw)
    return out
