"""The walk's request inside a serving engine with a clock (chapter 05), through the one
:class:`~workbench.engines.base.Engine` protocol: ``submit``, ``advance``, ``metrics``,
``memory_timeline``.

* ``backend="sim"``: a SimPy engine (:mod:`workbench.engines.sim`), vLLM-like or SGLang-like,
  whose elastic pool lives on a simulated H200; a step costs the step-time model's time plus every
  VMM call the scheduler made on its way.
* ``backend="gpu"`` / ``"host"``: :class:`~workbench.mini.instance.MiniInstance`, the mini engine
  (vLLM-like scheduler, a real tiny model) on the wall clock, its KV on that device's pages.
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.engines.metrics import MemorySample
from workbench.errors import ConfigError
from workbench.units import MiB
from workbench.viz.style import FONT, WHITE, pool_color

SAMPLE_S = 0.002  # memory samples every 2 ms of the engine's clock


def serving_engine(kind: str, backend: str, *, budget: int = 64):
    """An Engine for ``kind`` ("vllm" | "sglang") on ``backend`` (see module doc)."""
    from workbench.backends import capabilities, make_device

    if not capabilities(backend).simulated:
        from workbench.viz.lifecycle import REAL_TOKENS, build_engine

        if kind not in REAL_TOKENS:
            raise ConfigError(f"kind {kind!r} on backend {backend!r}",
                              "the engine with a real model (mini) schedules like vLLM only",
                              'use kind="vllm" there, or backend="sim" for the SGLang-like engine')
        from workbench.mini.instance import MiniInstance

        stepped = build_engine("vllm", make_device(backend), budget=budget)
        return MiniInstance(stepped.mini, sample_every_s=SAMPLE_S)
    import simpy

    from workbench.engines.models import get_model
    from workbench.engines.sim.cluster import SIM_ENGINES
    from workbench.engines.sim.kvsetup import elastic_pool
    from workbench.engines.sim.sglang_like import SGLangOptions
    from workbench.engines.sim.steptime import StepTimeModel
    from workbench.engines.sim.vllm_like import VLLMOptions

    env = simpy.Environment()
    device = make_device("sim", env=env)
    model = get_model("llama-3.1-8b")
    ikv = elastic_pool(model, device, name=kind, virtual_bytes=4 << 30)
    st = StepTimeModel.preset(model, "h200")
    options = {"vllm": lambda: VLLMOptions(max_num_batched_tokens=budget,
                                           enable_prefix_caching=True),
               "sglang": lambda: SGLangOptions(max_prefill_tokens=budget,
                                               chunked_prefill_size=budget)}
    if kind in options:
        return SIM_ENGINES[kind](env, kind, ikv, st, options=options[kind](),
                                 sample_every_s=SAMPLE_S)
    raise ConfigError(f"engine kind {kind!r}", "this chapter serves two engines",
                      "use one of vllm, sglang")


def settled(samples: list[MemorySample], tail: int = 3) -> list[MemorySample]:
    """``samples`` cut ``tail`` samples after the last change (an engine that has finished keeps
    sampling until its run ends; that idle stretch would flatten the picture)."""
    last = 0
    for i in range(1, len(samples)):
        a, b = samples[i - 1], samples[i]
        if (a.mapped_bytes, a.reserved_bytes, a.used_blocks) != \
                (b.mapped_bytes, b.reserved_bytes, b.used_blocks):
            last = i
    return samples[:last + 1 + tail]


def timeline_figure(samples: list[MemorySample], title: str = "Blocks and mapped memory while "
                                                                "serving"):
    """Per engine against its clock: blocks in use (solid, left axis) and mapped MiB (dashed,
    right axis) — blocks move with every request, mapped bytes only a page id at a time."""
    fig = go.Figure()
    names = list(dict.fromkeys(s.instance for s in samples))
    for i, name in enumerate(names):
        mine = settled([s for s in samples if s.instance == name])
        t = [s.t * 1e3 for s in mine]
        color = pool_color(i)
        fig.add_trace(go.Scatter(x=t, y=[s.used_blocks for s in mine], mode="lines",
                                 name=f"{name}: blocks in use",
                                 line=dict(color=color, width=2.5, shape="hv")))
        fig.add_trace(go.Scatter(x=t, y=[s.mapped_bytes / MiB for s in mine], mode="lines",
                                 name=f"{name}: mapped MiB", yaxis="y2",
                                 line=dict(color=color, dash="dash", shape="hv")))
    fig.update_layout(title=title, font=FONT, height=320, plot_bgcolor=WHITE,
                      xaxis=dict(title="engine clock (ms)"),
                      yaxis=dict(title="blocks in use", rangemode="tozero"),
                      yaxis2=dict(title="mapped MiB", overlaying="y", side="right",
                                  rangemode="tozero", showgrid=False),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      margin=dict(l=60, r=60, t=70, b=40))
    return fig
