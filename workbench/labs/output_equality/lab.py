"""Output equality (seed 000 §13): the same greedy tokens with static and elastic KV, and a canary
that catches a wrong KV layout the memory curves cannot show.

A real engine is needed to produce tokens, so this lab runs the mini engine (a Llama-shaped
decoder with seeded random weights) on ``host`` (the CPU; elastic KV on the host VMM device) or
``gpu`` (CUDA virtual memory). The simulator has no tokens: ``sim`` is refused.

* **Equality** (§13.1, §13.2): the reference is native (static) KV with the block layout; each
  case changes one thing: elastic memory; elastic with the per-layer token-slot layout; elastic
  with pages unmapped and mapped again between two waves; elastic under a pool so small that
  requests are preempted and recomputed (against static of the same size). Plus paged attention
  against dense attention (no KV cache at all).
* **Canary** (§13.3): views that disagree with the geometry (V over K, every layer over layer 0,
  half the block stride, layers permuted) are injected into an engine on static memory, where a
  wrong address reads stale bytes instead of faulting -- the silent case. The canary writes a
  mark into every (layer, K/V, block) through the engine's views and reads each back where the
  geometry says it lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import ENGINE_SGLANG, MODEL, QUICK, SEED
from workbench.labs.kit.vllm_report import real_result
from workbench.ranges import Spec


@dataclass(slots=True)
class OutputEqualityParams:
    quick: bool = False  # 4 prompts x 24 tokens, one seed; else 8 x 48, three seeds
    seed: int = 0  # prompt seed (the model's weights are seeded by the model config)
    model: str = "tiny"  # a mini-engine model (workbench.mini.model.get_config)
    engine: str = "mini"  # mini: the mini engine; vllm / sglang (gpu): a real one, elastic vs stock
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "quick": QUICK, "seed": SEED, "model": MODEL,
        "engine": ENGINE_SGLANG,
    }


class OutputEqualityLab(Lab):
    name = "output-equality"
    description = ("the same greedy tokens with static and elastic KV (mini engine), and a "
                   "layout canary that flags deliberately wrong KV views (seed 000 §13); "
                   "engine=vllm / engine=sglang: a real vLLM / SGLang, elastic vs stock")
    params_type = OutputEqualityParams
    backends = ("host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "mini"), "mini",
                     kinds=("vllm", "sglang"))

    def run(self, params: OutputEqualityParams, backend: str = "host",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import kind_kw, on_real

        if on_real(backend, params.engine):  # a real vLLM / SGLang: this lab's .vllm runner
            from workbench.labs.output_equality.report import vllm_report
            from workbench.labs.output_equality.vllm import run as run_vllm

            kw = kind_kw(params.engine)
            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick, **kw))
        from workbench.labs.output_equality.mini import run_all
        from workbench.labs.output_equality.report import figures, markdown, record, tables

        out = run_all(params, backend, progress)
        tabs = tables(out)
        return LabResult(record(out, tabs, params, backend), markdown(out, tabs, params),
                         tables=tabs, figures=figures(tabs))
