"""``workbench bench``: the allocator, the simulator's scaling (``scale``, logic in
:mod:`workbench.bench.scale`) and, on a CUDA GPU, ``vmm``: grow/shrink cost against the raw driver,
map cost per layout and bandwidth over VMM-backed KV (logic in :mod:`workbench.bench.vmm`), and
``crossover``: host-tier retrieve against recompute (:mod:`workbench.bench.crossover`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from workbench.bench.params import parser as _p
from workbench.cli import app

bench = typer.Typer(help="Benchmarks: the allocator itself, and VMM on a real GPU.",
                    no_args_is_help=True)
app.add_typer(bench, name="bench")


def _say(as_json: bool):
    """Progress on stderr, or nothing when stdout carries JSON."""
    return (lambda _m: None) if as_json else (lambda m: typer.echo(f"... {m}", err=True))


def _emit(res: dict, out: str, as_json: bool, lines) -> bool:
    """Write ``res`` to ``out`` (if given); print it as JSON or as its summary lines. Returns
    whether the summary was printed (so a command can add its own lines after it)."""
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    if as_json:
        typer.echo(json.dumps(res))
        return False
    for line in lines(res):
        typer.echo(line)
    return True


@bench.command()
def alloc(sizes=typer.Option("1,16,256,1024", parser=_p("alloc", "sizes"),
                             help="Request sizes in blocks."),
          seconds: float = typer.Option(0.5, parser=_p("alloc", "seconds"),
                                        help="Seconds per measurement."),
          repeats: int = typer.Option(5, parser=_p("alloc", "repeats"),
                                      help="Measurements per size (the median is shown)."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Allocator throughput on the simulated backend: alloc+free pairs per second by size."""
    from workbench.bench.alloc import alloc_throughput

    res = alloc_throughput(sizes, seconds=seconds, repeats=repeats)
    if as_json:
        typer.echo(json.dumps(res))
        return
    for n, r in res.items():
        typer.echo(f"{n:>5} blocks: {r['allocs_per_s']:>9,.0f} allocs/s  "
                   f"{r['blocks_per_s']:>11,.0f} blocks/s  {r['us_per_alloc_free']:.1f} us")


@bench.command()
def vmm(pages: int = typer.Option(40, parser=_p("vmm", "pages"),
                                  help="Page ids grown and shrunk per subject and round."),
        rounds: int = typer.Option(10, parser=_p("vmm", "rounds"),
                                   help="Interleaved rounds (the ratio spread is over them)."),
        bw_gib: int = typer.Option(4, parser=_p("vmm", "bw_gib"),
                                   help="GiB of KV for the bandwidth kernels."),
        bw_repeats: int = typer.Option(10, parser=_p("vmm", "bw_repeats"),
                                       help="Interleaved repeats of each bandwidth pairing."),
        bandwidth: bool = typer.Option(True, help="Run the bandwidth kernels."),
        out: str = typer.Option("", help="Also write the JSON record to this file."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Grow/shrink vs raw cuMem* calls, warm-reserve alloc latency, VMM vs plain bandwidth.

    Per-page grow and shrink through the workbench against the bare driver calls, interleaved
    page by page (order reversed each round): medians and the p10/p90 of per-round ratios, both
    layouts, with and without the zero page; alloc latency when the reserve is warm; bandwidth
    like for like (same kernels, same launch count).
    """
    try:
        from workbench.bench.vmm import run_vmm, summary_lines
    except ImportError as err:
        typer.echo(f"error: the gpu backend cannot be loaded ({err}); install torch and "
                   "cuda-python (pip install 'workbench[gpu]') on a CUDA host", err=True)
        raise typer.Exit(2) from None
    from workbench.errors import DeviceError

    say = _say(as_json)
    try:
        res = run_vmm(pages, rounds, bw_gib, bandwidth, bw_repeats, progress=say)
    except DeviceError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    if as_json:
        typer.echo(json.dumps(res))
        return
    typer.echo(f"{res['device']}  granularity {res['granularity'] >> 20} MiB  "
               f"zero page: {res['zero_access']}")
    for line in summary_lines(res):
        typer.echo(line)
    r = res["reserve"]
    typer.echo(f"reserve: {r['reserve_ms_per_gib_nozero']:.3f} ms/GiB without, "
               f"{r['reserve_ms_per_gib_zero']:.3f} ms/GiB with the zero page; "
               f"cuMemGetInfo {r['cuMemGetInfo_us']:.1f} us")


@bench.command()
def overhead(pages: int = typer.Option(40, parser=_p("overhead", "pages"),
                                       help="Page ids per subject and round."),
             rounds: int = typer.Option(8, parser=_p("overhead", "rounds"),
                                        help="Interleaved rounds per repeat."),
             repeats: int = typer.Option(5, parser=_p("overhead", "repeats"),
                                         help="Repeats (the median is shown)."),
             out: str = typer.Option("", help="Also write the JSON record to this file."),
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The Python the workbench adds per page id, on a CPU: ``bench vmm``'s subjects over an
    instant fake driver, against the H200's raw cost (the budget for a 1.10 ratio)."""
    from workbench.bench.overhead import run_overhead, summary_lines

    say = _say(as_json)
    res = run_overhead(pages, rounds, repeats, progress=say)
    if not _emit(res, out, as_json, summary_lines):
        return


@bench.command()
def scale(repeats: int = typer.Option(3, parser=_p("scale", "repeats"),
                                     help="Runs per point (seeds 0..repeats-1)."),
          requests: int = typer.Option(20, parser=_p("scale", "requests"),
                                       help="Requests per instance in the base trace."),
          longer: int = typer.Option(10, parser=_p("scale", "longer"),
                                     help="How many times longer the long traces are."),
          profile: bool = typer.Option(False, help="Also print a cProfile of the biggest point."),
          out: str = typer.Option("", help="Also write the JSON record to this file."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Simulated seconds per CPU second at 1, 3, 16 and 64 instances and on longer traces."""
    from workbench.bench.scale import default_points, profile_point, run_scale, summary_lines

    points = default_points(requests, longer)
    say = _say(as_json)
    res = run_scale(points, repeats, progress=say)
    if not _emit(res, out, as_json, summary_lines):
        return
    if profile:
        typer.echo(profile_point(max(points, key=lambda p: p.instances * p.requests)))


@bench.command()
def crossover(backend: str = typer.Option("gpu", parser=_p("crossover", "backend"),
                                          help="gpu (CUDA) or host (CPU)."),
              model: str = typer.Option("llama-3.1-8b", parser=_p("crossover", "model"),
                                        help="Model shape (random weights)."),
              lens=typer.Option("256,1024,4096,8192", parser=_p("crossover", "lens"),
                                help="Prompt lengths."),
              chunks=typer.Option("256,1024", parser=_p("crossover", "chunks"),
                                  help="Host-tier chunk sizes (tokens)."),
              concurrency=typer.Option("1,4,16", parser=_p("crossover", "concurrency"),
                                       help="Prompts admitted together."),
              repeats: int = typer.Option(3, parser=_p("crossover", "repeats"),
                                          help="Interleaved repeats per cell."),
              max_cell_tokens: int = typer.Option(32768, parser=_p("crossover",
                                                                   "max_cell_tokens"),
                                                  help="Skip cells over this many "
                                                  "tokens (sizes the tier and the KV)."),
              out: str = typer.Option("", help="Also write the JSON record to this file."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Retrieve a prefix from pinned host memory (H2D copies into VMM KV: lookup / copy / wait)
    or prefill it again: medians and p10/p90 per prompt length, chunk size and concurrency, the
    crossover, the effective H2D bandwidth (logic in :mod:`workbench.bench.crossover`)."""
    from workbench.bench.crossover import CrossoverConfig, run_crossover, summary_lines

    cfg = CrossoverConfig(backend=backend, model=model, lens=lens, chunks=chunks,
                          concurrency=concurrency, repeats=repeats,
                          max_cell_tokens=max_cell_tokens)
    res = run_crossover(cfg, progress=_say(as_json))
    _emit(res, out, as_json, summary_lines)
