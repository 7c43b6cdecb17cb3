"""``workbench bench overhead``: the Python the workbench adds per page id, measured on a CPU.

``workbench bench vmm`` compares the workbench's grow and shrink with the bare driver calls on a
GPU. Here both run over :class:`~workbench.gpu.fakedriver.FakeDriver`, which answers at once, so
what is left is the Python each path costs: the workbench's minus the raw baseline's is the
overhead it adds per page id. On the H200 the raw calls take ~40-60 µs per contiguous page id and
~2.5 ms per per-layer one, so a ratio of at most 1.10 needs that overhead within ~4-6 µs
(contiguous) and ~250 µs (per-layer, 64 targets).
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable

from workbench.core.geometry import Layout
from workbench.gpu.driver import use_driver
from workbench.gpu.fakedriver import FakeDriver

# Raw cost of one page id on the H200 (DESIGN.md, Backends; docs/gpu.md), for the budget.
H200_RAW_US = {"contiguous": {"grow": 40.0, "shrink": 57.0},
               "per_layer": {"grow": 2500.0, "shrink": 2100.0}}
GOAL_RATIO = 1.10


def measure(layout: Layout, pages: int = 40, rounds: int = 8, repeats: int = 5) -> dict:
    """Per-page-id grow and shrink µs of every ``bench vmm`` subject over the instant driver:
    medians over ``repeats`` runs of the interleaved rounds."""
    from workbench.bench.vmm import grow_shrink

    runs = []
    for _ in range(repeats):
        with use_driver(FakeDriver()):
            runs.append(grow_shrink(layout, pages, rounds))
    out: dict = {"layout": layout.value, "maps_per_page_id": runs[0]["maps_per_page_id"]}
    for subject in ("raw", "raw_zero", "workbench_nozero", "workbench_zero", "core_on_sim"):
        out[subject] = {k: sorted(r[subject][k] for r in runs)[len(runs) // 2]
                        for k in ("grow_us", "shrink_us")}
    for kind in ("grow", "shrink"):
        k = f"{kind}_us"
        raw = H200_RAW_US[layout.value][kind]
        added = out["workbench_nozero"][k] - out["raw"][k]
        added_zero = out["workbench_zero"][k] - out["raw_zero"][k]
        out[f"added_{kind}_us"] = added
        out[f"added_{kind}_zero_us"] = added_zero
        out[f"budget_{kind}_us"] = (GOAL_RATIO - 1) * raw
        out[f"predicted_ratio_{kind}"] = (raw + added) / raw
    return out


def run_overhead(pages: int = 40, rounds: int = 8, repeats: int = 5,
                 progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda _m: None)
    out = {}
    for layout in (Layout.CONTIGUOUS, Layout.PER_LAYER):
        say(f"overhead, {layout.value}")
        out[layout.value] = measure(layout, pages, rounds, repeats)
    return out


def summary_lines(res: dict) -> list[str]:
    lines = []
    for lay, r in res.items():
        for kind in ("grow", "shrink"):
            lines.append(
                f"overhead {lay:<10} {kind:<6} raw {r['raw'][f'{kind}_us']:7.1f} us"
                f"  workbench {r['workbench_nozero'][f'{kind}_us']:7.1f}"
                f"  added {r[f'added_{kind}_us']:7.1f}"
                f" (zero page {r[f'added_{kind}_zero_us']:7.1f})"
                f"  budget {r[f'budget_{kind}_us']:6.1f}"
                f"  core on sim {r['core_on_sim'][f'{kind}_us']:6.1f}"
                f"  => H200 ratio ~{r[f'predicted_ratio_{kind}']:.3f}")
    return lines


def profile(layout: Layout = Layout.CONTIGUOUS, top: int = 20) -> str:
    """cProfile of the workbench subjects' grow and shrink over the instant driver."""
    from workbench.bench.vmm import grow_shrink

    prof = cProfile.Profile()
    with use_driver(FakeDriver()):
        prof.enable()
        grow_shrink(layout, 40, 8)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()
