"""``workbench bench``: the allocator, the simulator's scaling (``scale``, logic in
:mod:`workbench.bench.scale`) and, on a CUDA GPU, ``vmm``: grow/shrink cost against the raw driver,
map cost per layout and bandwidth over VMM-backed KV (logic in :mod:`workbench.bench.vmm`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from workbench.cli import app

bench = typer.Typer(help="Benchmarks: the allocator itself, and VMM on a real GPU.",
                    no_args_is_help=True)
app.add_typer(bench, name="bench")


@bench.command()
def alloc(sizes: str = typer.Option("1,16,256,1024", help="Request sizes in blocks."),
          seconds: float = typer.Option(0.5, help="Seconds per measurement."),
          repeats: int = typer.Option(5, help="Measurements per size (the median is shown)."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Allocator throughput on the simulated backend: alloc+free pairs per second by size."""
    from workbench.bench.alloc import alloc_throughput

    try:
        ns = tuple(int(x) for x in sizes.split(","))
    except ValueError:
        typer.echo(f"error: --sizes {sizes!r} is not a comma-separated list of integers",
                   err=True)
        raise typer.Exit(2) from None
    res = alloc_throughput(ns, seconds=seconds, repeats=repeats)
    if as_json:
        typer.echo(json.dumps(res))
        return
    for n, r in res.items():
        typer.echo(f"{n:>5} blocks: {r['allocs_per_s']:>9,.0f} allocs/s  "
                   f"{r['blocks_per_s']:>11,.0f} blocks/s  {r['us_per_alloc_free']:.1f} us")


@bench.command()
def vmm(pages: int = typer.Option(40, help="Page ids grown and shrunk per subject."),
        rounds: int = typer.Option(4, help="Interleaved rounds (subjects alternate each round)."),
        bw_gib: int = typer.Option(4, help="GiB of KV for the bandwidth kernels."),
        bandwidth: bool = typer.Option(True, help="Run the bandwidth kernels."),
        out: str = typer.Option("", help="Also write the JSON record to this file."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Grow/shrink vs raw cuMem* calls, map cost per layout, VMM vs plain bandwidth.

    Per-page grow and shrink through the workbench against the bare driver calls (same run,
    interleaved, medians); map cost per page id for a 32-layer model, contiguous vs per-layer;
    sum and in-place add over VMM-backed vs plainly allocated KV of the same size.
    """
    try:
        from workbench.bench.vmm import run_vmm
    except ImportError as err:
        typer.echo(f"error: the gpu backend cannot be loaded ({err}); install torch and "
                   "cuda-python (pip install 'workbench[gpu]') on a CUDA host", err=True)
        raise typer.Exit(2) from None
    from workbench.errors import DeviceError

    say = (lambda _m: None) if as_json else (lambda m: typer.echo(f"... {m}", err=True))
    try:
        res = run_vmm(pages, rounds, bw_gib, bandwidth, progress=say)
    except DeviceError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    if as_json:
        typer.echo(json.dumps(res))
        return
    _print(res)


def _print(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"{res['device']}  granularity {res['granularity'] >> 20} MiB  "
            f"zero page: {res['zero_access']}")
    t = Table("layout", "maps/page id", "subject", "grow µs", "shrink µs")
    for lay in ("contiguous", "per_layer"):
        r = res[lay]
        for k in ("raw", "workbench_nozero", "raw_zero", "workbench_zero", "core_on_sim"):
            t.add_row(lay, str(r["maps_per_page_id"]), k, f"{r[k]['grow_us']:.1f}",
                      f"{r[k]['shrink_us']:.1f}")
    c.print(t)
    g = res["goals"]
    c.print(f"worst workbench/raw ratio (no zero page): {g['grow_shrink_ratio_worst_nozero']:.3f}"
            f"  (with zero page vs raw+zero swap: "
            f"{g['grow_shrink_ratio_worst_zero_vs_raw_zero']:.3f}; goal <= 1.15)")
    if "bandwidth" in res:
        b = res["bandwidth"]
        bt = Table("KV", "sum TB/s", "in-place add TB/s")
        for k in ("plain", "vmm_contiguous", "vmm_per_layer"):
            bt.add_row(k, f"{b[k]['sum_TBps']:.3f}", f"{b[k]['add_TBps']:.3f}")
        c.print(bt)
        c.print(f"worst VMM/plain bandwidth ratio: {g['bandwidth_ratio_worst']:.3f} (goal >= 0.98)")
    r = res["reserve"]
    c.print(f"reserve: {r['reserve_ms_per_gib_nozero']:.3f} ms/GiB without, "
            f"{r['reserve_ms_per_gib_zero']:.3f} ms/GiB with the zero page; "
            f"cuMemGetInfo {r['cuMemGetInfo_us']:.1f} µs")


@bench.command()
def scale(repeats: int = typer.Option(3, help="Runs per point (seeds 0..repeats-1)."),
          requests: int = typer.Option(20, help="Requests per instance in the base trace."),
          longer: int = typer.Option(10, help="How many times longer the long traces are."),
          profile: bool = typer.Option(False, help="Also print a cProfile of the biggest point."),
          out: str = typer.Option("", help="Also write the JSON record to this file."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Simulated seconds per CPU second at 1, 3, 16 and 64 instances and on longer traces."""
    from workbench.bench.scale import default_points, profile_point, run_scale, summary_lines

    if repeats < 1 or requests < 1 or longer < 1:
        typer.echo("error: --repeats, --requests and --longer must be at least 1", err=True)
        raise typer.Exit(2)
    points = default_points(requests, longer)
    say = (lambda _m: None) if as_json else (lambda m: typer.echo(f"... {m}", err=True))
    res = run_scale(points, repeats, progress=say)
    if out:
        Path(out).write_text(json.dumps(res, indent=2))
    if as_json:
        typer.echo(json.dumps(res))
        return
    for line in summary_lines(res):
        typer.echo(line)
    if profile:
        typer.echo(profile_point(max(points, key=lambda p: p.instances * p.requests)))
