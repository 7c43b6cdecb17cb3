"""The control-groups lab's parameters and their declared ranges (below its runners and
its report, which import them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.labs.kit.params import QUICK, SEED, STEPTIME
from workbench.ranges import Choices, Num, Opt, Spec

WORKLOADS = ("readme", "shared_prefix", "simultaneous")


@dataclass(slots=True)
class ControlGroupsParams:
    peak: int = 16  # kvcached ramp PEAK (req/s per instance at its top)
    workloads: tuple[str, ...] = WORKLOADS
    cached_tokens: int = 16000  # group D's bound per instance (kvcached's bench value)
    steptime: str | None = "kvcached-fit"  # a calibration name or key=value overrides
    repeats: int = 1  # seeds seed, seed+1...; the ramp's arrival times are fixed, only tokens vary
    seed: int = 0
    quick: bool = False  # the readme and simultaneous workloads only
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "peak": Num(int, 1, 200, "req/s"), "workloads": Choices(WORKLOADS),
        "cached_tokens": Num(int, 1, 10_000_000, "tokens"), "steptime": Opt(STEPTIME),
        "repeats": Num(int, 1, 20), "seed": SEED, "quick": QUICK,
    }
