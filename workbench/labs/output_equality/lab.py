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

from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import check_runner
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result
from workbench.labs.output_equality.params import OutputEqualityParams


def run_mini(params: OutputEqualityParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    from workbench.labs.output_equality.mini import run_all
    from workbench.labs.output_equality.report import figures, markdown, record, tables

    out = run_all(params, run.backend, progress)
    tabs = tables(out)
    return LabResult(record(out, tabs, params, run.backend), markdown(out, tabs, params),
                     tables=tabs, figures=figures(tabs))


def run_server(params: OutputEqualityParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.output_equality.report import vllm_report
    from workbench.labs.output_equality.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick,
                                                     kind=run.kind, runner=params.runner))


class OutputEqualityLab(Lab):
    name = "output-equality"
    description = ("the same greedy tokens with static and elastic KV (mini engine), and a "
                   "layout canary that flags deliberately wrong KV views (seed 000 §13); "
                   "engine=vllm / engine=sglang: a real vLLM / SGLang, elastic vs stock")
    params_type = OutputEqualityParams
    runners = {"mini": run_mini, "server": run_server}

    def check_run(self, params: OutputEqualityParams, run: LabRun) -> None:
        check_runner(self.name, params.runner, run)
