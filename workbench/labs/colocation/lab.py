"""The colocation lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.mini`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from contextlib import nullcontext

from workbench.errors import ConfigError
from workbench.labs.colocation.params import ColocationParams
from workbench.labs.colocation.report import build_record, figures, make_points, markdown
from workbench.labs.colocation.rows import reading_sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun


def _checked(params: ColocationParams) -> ColocationParams:
    if not 1 <= params.repeats <= 100 or params.first_repeat < 0:
        raise ConfigError(f"repeats={params.repeats}, first_repeat={params.first_repeat}",
                          "a sweep runs 1 to 100 repeats, numbered from 0 or more",
                          "use e.g. repeats=3, first_repeat=0")
    return params


def _result(params: ColocationParams, run) -> LabResult:
    """The one hand-off to the report; records read back from files (from_dir) are outside
    input, so a bad field there is one line."""
    with reading_sweep(f"from_dir={params.from_dir!r}") if params.from_dir else nullcontext():
        points = make_points(run)
        return LabResult(build_record(run, points), markdown(run, points),
                         tables={"points": points}, figures=figures(points))


def run_sim(params: ColocationParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    from workbench.labs.colocation.sim import run_sim as sweep

    return _result(params, sweep(_checked(params), progress))


def run_mini(params: ColocationParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    """Mini engines on real memory; a vLLM sweep's saved repeats (from_dir) are read by the
    server runner's reader."""
    from workbench.labs.colocation.mini import run_mini as sweep
    from workbench.labs.colocation.saved import saved_family

    if params.from_dir and saved_family(params.from_dir) == "server":
        return run_server(params, run, progress)
    return _result(params, sweep(_checked(params), run.backend, progress))


def run_server(params: ColocationParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    from workbench.labs.colocation.vllm_lab import run_vllm

    return _result(params, run_vllm(_checked(params), run.backend, progress))


class ColocationLab(Lab):
    name = "colocation"
    description = ("3 x Llama-3.1-8B on one GPU under staggered ramp peaks: static KV split vs "
                   "elastic KV; mean/p99 TTFT and speedups (sim: next to kvcached's table)")
    params_type = ColocationParams
    runners = {"simulated": run_sim, "mini": run_mini, "server": run_server}
    reads_back = "from_dir"  # saved repeats: read back, no engine started
