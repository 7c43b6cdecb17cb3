"""The colocation lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    engine: str | None = None  # none: sim-vllm on sim, mini on host/gpu; vllm: real vLLMs
    together: bool | None = None  # vllm: both modes' engines up all run (None: gpu yes, host no)
    deadline_s: float | None = None  # vllm: start no point past this many seconds of wall time
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "peaks": Opt(Ints(1, 10000)), "quick": QUICK, "seed": SEED, "steptime": Opt(STEPTIME),
        "workers": Opt(Num(int, 1, 32)), "model": Opt(MODEL), "budget_gib": GIB,
        "time_scale": Num(float, 0.01, 1000.0), "prompt_len": TOKENS, "completion_len": TOKENS,
        "repeats": Num(int, 1, 100), "first_repeat": Num(int, 0, 99),
        "out_dir": Opt(Text()), "from_dir": Opt(Text()), "mapper": Flag(),
        "cuda_graphs": Opt(Flag()), "together": Opt(Flag()),
        "engine": Opt(ENGINE("sim-vllm", "mini", "vllm")),  # None: sim-vllm on sim, else mini
        "deadline_s": Opt(Num(float, 1.0, 86400.0, "s")),
    }
