"""Every benchmark's parameters with their declared ranges and choices (:mod:`workbench.ranges`):
one table per bench, used by ``workbench bench``'s options and by the bench functions, so a value
is refused in one line before anything runs. Upper bounds keep a run on a small machine
(2 cores, 24 GiB) within minutes and its memory: the CPU benches hold a few MiB; ``vmm`` and
``crossover`` size GPU memory and are bounded by one H200."""

from __future__ import annotations

from typing import Any

from workbench.engines.models import mini_models
from workbench.ranges import Choice, Ints, Num, Spec, check_all

ALLOC: dict[str, Spec] = {
    "sizes": Ints(1, 16384),  # the bench pool holds 65536 blocks: an alloc is always served
    "seconds": Num(float, 0.01, 60, "seconds"),
    "repeats": Num(int, 1, 100),
}
OVERHEAD: dict[str, Spec] = {
    "pages": Num(int, 1, 4096),
    "rounds": Num(int, 1, 1000),
    "repeats": Num(int, 1, 100),
}
SCALE: dict[str, Spec] = {
    "repeats": Num(int, 1, 20),
    "requests": Num(int, 1, 200),  # x 64 instances, x longer: the largest point's trace
    "longer": Num(int, 1, 20),
}
VMM: dict[str, Spec] = {
    "pages": Num(int, 1, 4096),
    "rounds": Num(int, 1, 1000),
    "bw_gib": Num(int, 1, 64, "GiB"),
    "bw_repeats": Num(int, 1, 1000),
}
CROSSOVER: dict[str, Spec] = {
    "backend": Choice(("gpu", "host")),
    "model": Choice(mini_models()),  # what the mini engine builds
    "lens": Ints(1, 1 << 17),
    "chunks": Ints(1, 1 << 17),
    "concurrency": Ints(1, 1024),
    "repeats": Num(int, 1, 100),
    "max_cell_tokens": Num(int, 1, 1 << 18),  # crossover.MAX_CELL_TOKENS
}
TABLES = {"alloc": ALLOC, "overhead": OVERHEAD, "scale": SCALE, "vmm": VMM,
          "crossover": CROSSOVER}


def check(bench: str, **values: Any) -> dict[str, Any]:
    """``values`` of bench ``bench`` checked (one-line ConfigError naming ``bench.param``)."""
    return check_all(TABLES[bench], f"bench {bench} ", **values)


def parser(bench: str, param: str):
    """The command-line parser of one option: its spec, named as the option is spelled."""
    return TABLES[bench][param].parser("--" + param.replace("_", "-"))
