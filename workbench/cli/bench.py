"""``workbench bench``: the allocator, the simulator's scaling (``scale``, logic in
workbench.bench.scale), ``overhead`` (the Python per page id, on a CPU) and, on a CUDA GPU,
``vmm``: grow/shrink cost against the raw driver, map cost per layout and bandwidth over
VMM-backed KV (workbench.bench.vmm), and ``crossover``: host-tier retrieve against recompute
(workbench.bench.crossover)."""

from __future__ import annotations

from pathlib import Path

import typer

from workbench.bench.params import parser as _p
from workbench.cli.common import (
    backend_option,
    choice_option,
    emit,
    fail,
    model_names,
    out_option,
    progress,
    requires,
    requires_torch,
)
from workbench.cli.root import app

bench = typer.Typer(help="Benchmarks: the allocator itself, and VMM on a real GPU.",
                    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(bench, name="bench")

OUT = out_option("Write the JSON record to this file.")
JSON = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


def _alloc_lines(res: dict) -> list[str]:
    return [f"{n:>5} blocks: {r['allocs_per_s']:>9,.0f} allocs/s  "
            f"{r['blocks_per_s']:>11,.0f} blocks/s  {r['us_per_alloc_free']:.1f} us"
            for n, r in res.items()]


@bench.command(short_help='Allocator throughput (simulated backend).')
def alloc(sizes=typer.Option("1,16,256,1024", parser=_p("alloc", "sizes"),
                             help="Request sizes in blocks."),
          seconds: float = typer.Option(0.5, parser=_p("alloc", "seconds"),
                                        help="Seconds per measurement."),
          repeats: int = typer.Option(5, parser=_p("alloc", "repeats"),
                                      help="Measurements per size (the median is shown)."),
          out: Path | None = OUT, as_json: bool = JSON) -> None:
    """Allocator throughput on the simulated backend: alloc+free pairs per second by size."""
    from workbench.bench.alloc import alloc_throughput

    with progress("bench alloc") as say:
        res = alloc_throughput(sizes, seconds=seconds, repeats=repeats, progress=say)
    emit(res, out, as_json, _alloc_lines)


def _vmm_lines(res: dict) -> list[str]:
    from workbench.bench.vmm import summary_lines

    r = res["reserve"]
    return [f"{res['device']}  granularity {res['granularity'] >> 20} MiB  "
            f"zero page: {res['zero_access']}", *summary_lines(res),
            f"reserve: {r['reserve_ms_per_gib_nozero']:.3f} ms/GiB without, "
            f"{r['reserve_ms_per_gib_zero']:.3f} ms/GiB with the zero page; "
            f"cuMemGetInfo {r['cuMemGetInfo_us']:.1f} us"]


@bench.command(short_help='Grow/shrink and bandwidth on a CUDA GPU.')
def vmm(pages: int = typer.Option(40, parser=_p("vmm", "pages"),
                                  help="Page ids grown and shrunk per subject and round."),
        rounds: int = typer.Option(10, parser=_p("vmm", "rounds"),
                                   help="Interleaved rounds (the ratio spread is over them)."),
        bw_gib: int = typer.Option(4, parser=_p("vmm", "bw_gib"),
                                   help="GiB of KV for the bandwidth kernels."),
        bw_repeats: int = typer.Option(10, parser=_p("vmm", "bw_repeats"),
                                       help="Interleaved repeats of each bandwidth pairing."),
        no_bandwidth: bool = typer.Option(False, "--no-bandwidth",
                                          help="Skip the bandwidth kernels."),
        out: Path | None = OUT, as_json: bool = JSON) -> None:
    """Grow/shrink against raw cuMem* calls, warm-reserve alloc latency, and VMM against plain
    bandwidth, on a CUDA GPU (needs torch and cuda-python).

    Per-page grow and shrink through the workbench against the bare driver calls, interleaved
    page by page (order reversed each round): medians and the p10/p90 of per-round ratios, both
    layouts, with and without the zero page; alloc latency when the reserve is warm; bandwidth
    like for like (same kernels, same launch count).
    """
    requires_torch("bench vmm", "its bandwidth kernels and raw baselines run on it")
    requires("cuda.bindings", "bench vmm", "it calls the CUDA driver's VMM API",
             "pip install 'kv-cache-workbench[gpu]' on a CUDA host")
    from workbench.bench.vmm import run_vmm
    from workbench.errors import DeviceError

    try:
        with progress("bench vmm") as say:
            res = run_vmm(pages, rounds, bw_gib, not no_bandwidth, bw_repeats, progress=say)
    except DeviceError as err:
        raise fail(err) from None
    emit(res, out, as_json, _vmm_lines)


@bench.command(short_help='The Python added per page id (a CPU).')
def overhead(pages: int = typer.Option(40, parser=_p("overhead", "pages"),
                                       help="Page ids per subject and round."),
             rounds: int = typer.Option(8, parser=_p("overhead", "rounds"),
                                        help="Interleaved rounds per repeat."),
             repeats: int = typer.Option(5, parser=_p("overhead", "repeats"),
                                         help="Repeats (the median is shown)."),
             out: Path | None = OUT, as_json: bool = JSON) -> None:
    """The Python the workbench adds per page id, on a CPU: the subjects of bench vmm over an
    instant fake driver, against the H200's raw cost (the budget for a 1.10 ratio)."""
    from workbench.bench.overhead import run_overhead, summary_lines

    with progress("bench overhead") as say:
        res = run_overhead(pages, rounds, repeats, progress=say)
    emit(res, out, as_json, summary_lines)


@bench.command(short_help='Simulated seconds per CPU second.')
def scale(repeats: int = typer.Option(3, parser=_p("scale", "repeats"),
                                      help="Runs per point (seeds 0..repeats-1)."),
          requests: int = typer.Option(20, parser=_p("scale", "requests"),
                                       help="Requests per instance in the base "
                                       "trace."),
          longer: int = typer.Option(10, parser=_p("scale", "longer"),
                                     help="How many times longer the long traces "
                                     "are."),
          profile: bool = typer.Option(False, "--profile",
                                       help="Also print a cProfile of the biggest point."),
          out: Path | None = OUT, as_json: bool = JSON) -> None:
    """Simulated seconds per CPU second at 1, 3, 16 and 64 instances and on longer traces."""
    from workbench.bench.scale import default_points, profile_point, run_scale, summary_lines

    points = default_points(requests, longer)
    with progress("bench scale") as say:
        res = run_scale(points, repeats, progress=say)
    if emit(res, out, as_json, summary_lines) and profile:
        typer.echo(profile_point(max(points, key=lambda p: p.instances * p.requests)))


@bench.command(short_help='Host-tier retrieve against recompute.')
def crossover(backend: str = backend_option("gpu", ("gpu", "host"),
                                            "gpu (CUDA) or host (the CPU)."),
              model: str = choice_option("llama-3.1-8b", model_names(), "--model",
                                         "Model shape (random weights)."),
              lens=typer.Option("256,1024,4096,8192", parser=_p("crossover", "lens"),
                                help="Prompt lengths."),
              chunks=typer.Option("256,1024", parser=_p("crossover", "chunks"),
                                  help="Host-tier chunk sizes (tokens)."),
              concurrency=typer.Option("1,4,16", parser=_p("crossover", "concurrency"),
                                       help="Prompts admitted together."),
              repeats: int = typer.Option(3, parser=_p("crossover", "repeats"),
                                          help="Interleaved repeats per cell."),
              max_cell_tokens: int = typer.Option(32768, parser=_p("crossover", "max_cell_tokens"),
                                                  help="Skip cells over this many "
                                                  "tokens (sizes the tier and the KV)."),
              out: Path | None = OUT, as_json: bool = JSON) -> None:
    """Retrieve a prefix from pinned host memory (host-to-device copies into VMM KV: lookup,
    copy, wait) or prefill it again: medians and p10/p90 per prompt length, chunk size and
    concurrency, the crossover and the effective host-to-device bandwidth. Needs torch."""
    requires_torch("bench crossover")
    from workbench.bench.crossover import CrossoverConfig, run_crossover, summary_lines
    from workbench.errors import WorkbenchError

    cfg = CrossoverConfig(backend=backend, model=model, lens=lens,
                          chunks=chunks,
                          concurrency=concurrency, repeats=repeats,
                          max_cell_tokens=max_cell_tokens)
    try:
        with progress("bench crossover") as say:
            res = run_crossover(cfg, progress=say)
    except WorkbenchError as err:
        raise fail(err) from None
    emit(res, out, as_json, summary_lines)
