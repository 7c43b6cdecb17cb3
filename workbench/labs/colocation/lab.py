"""The colocation lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.mini`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar

from workbench.backends import capabilities
from workbench.errors import ConfigError
from workbench.labs.colocation.report import (
    build_record,
    figures,
    make_points,
    markdown,
)
from workbench.labs.colocation.rows import reading_sweep
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import ENGINE, GIB, MODEL, QUICK, SEED, STEPTIME, TOKENS
from workbench.ranges import Flag, Ints, Num, Opt, Spec, Text


@dataclass(slots=True)
class ColocationParams:
    peaks: tuple[int, ...] | None = None  # None: sim 12..20, gpu/host 2,6,12 (before scaling)
    quick: bool = False  # sim: PEAK 12, 16, 20; gpu/host: the first two peaks
    seed: int = 0
    steptime: str | None = None  # sim: a calibration name or key=value,... overrides
    workers: int | None = None  # sim: processes for the sweep
    model: str | None = None  # gpu/host: registry name (default llama-3.1-8b; host: tiny)
    budget_gib: float = 2.0  # gpu/host: GiB of KV all instances hold together
    time_scale: float = 4.0  # gpu/host: arrival times / scale, completions / scale
    prompt_len: int = 256
    completion_len: int = 256  # before scaling
    repeats: int = 1  # gpu/host: runs of every (PEAK, mode); sim: seeds seed..seed+repeats-1
    first_repeat: int = 0  # gpu/host: index of the first repeat (even: static first, odd: elastic)
    out_dir: str | None = None  # gpu/host: each repeat's raw JSON lands here as the sweep goes
    from_dir: str | None = None  # gpu/host: build the report from the repeat JSONs in this folder
    mapper: bool = True  # gpu/host elastic: background mapper (reserve 1) vs inline maps (0..1)
    cuda_graphs: bool | None = None  # gpu: decode CUDA graphs (None: on; False: eager)
    engine: str | None = None  # gpu/host: mini (default) or vllm (real vLLM servers)
    together: bool | None = None  # vllm: both modes' engines up all run (None: gpu yes, host no)
    deadline_s: float | None = None  # vllm: start no point past this many seconds of wall time
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "peaks": Opt(Ints(1, 10000)), "quick": QUICK, "seed": SEED, "steptime": Opt(STEPTIME),
        "workers": Opt(Num(int, 1, 32)), "model": Opt(MODEL), "budget_gib": GIB,
        "time_scale": Num(float, 0.01, 1000.0), "prompt_len": TOKENS, "completion_len": TOKENS,
        "repeats": Num(int, 1, 100), "first_repeat": Num(int, 0, 99),
        "out_dir": Opt(Text()), "from_dir": Opt(Text()), "mapper": Flag(),
        "cuda_graphs": Opt(Flag()), "engine": Opt(ENGINE), "together": Opt(Flag()),
        "deadline_s": Opt(Num(float, 1.0, 86400.0, "s")),
    }


class ColocationLab(Lab):
    name = "colocation"
    description = ("3 x Llama-3.1-8B on one GPU under staggered ramp peaks: static KV split vs "
                   "elastic KV; mean/p99 TTFT and speedups (sim: next to kvcached's table)")
    params_type = ColocationParams
    backends = ("sim", "gpu", "host")

    def check_backend(self, backend: str, params: ColocationParams | None = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        engine = getattr(params, "engine", None)
        if engine is not None and not getattr(params, "from_dir", None):
            real = not capabilities(backend).simulated
            check_engine(self.name, backend, engine, "mini" if real else "vllm")

    def run(self, params: ColocationParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        if not 1 <= params.repeats <= 100 or params.first_repeat < 0:
            raise ConfigError(f"repeats={params.repeats}, first_repeat={params.first_repeat}",
                              "a sweep runs 1 to 100 repeats, numbered from 0 or more",
                              "use e.g. repeats=3, first_repeat=0")
        if capabilities(backend).simulated:
            from workbench.labs.colocation.sim import run_sim

            run = run_sim(params, progress)
        elif params.engine == "vllm" or _vllm_sweep(params.from_dir):
            from workbench.labs.colocation.vllm_lab import run_vllm

            run = run_vllm(params, backend, progress)
        else:
            from workbench.labs.colocation.mini import run_mini

            run = run_mini(params, backend, progress)
        # records read back from files (from_dir) are outside input: a bad field is one line
        with reading_sweep(f"from_dir={params.from_dir!r}") if params.from_dir else nullcontext():
            points = make_points(run)
            return LabResult(build_record(run, points), markdown(run, points),
                             tables={"points": points}, figures=figures(points))


def _vllm_sweep(from_dir: str | None) -> bool:
    """``from_dir`` holds a real-vLLM sweep's repeat files (read back without vLLM)."""
    if not from_dir:
        return False
    from workbench.labs.colocation.saved import read_sweep

    return read_sweep(from_dir.split(",")[0])[0].get("engine") == "vllm"
