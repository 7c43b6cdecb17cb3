"""``workbench labs list|run NAME``: run a lab, print its Markdown report, write its JSON record."""

from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from workbench.cli import app
from workbench.errors import ConfigError
from workbench.labs import LABS

labs = typer.Typer(help="Run the workbench's labs (simulated experiments with result records).",
                   no_args_is_help=True)
app.add_typer(labs, name="labs")
err_console = Console(stderr=True)


def _module(name: str):
    if name not in LABS:
        err_console.print(f"error: no lab named {name!r}; `workbench labs list` shows them")
        raise typer.Exit(2)
    return importlib.import_module(LABS[name])


def _steptime(text: str) -> str | dict[str, float]:
    if "=" not in text:
        return text
    out: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            err_console.print(f"error: --steptime {part!r} is not key=number; write e.g. "
                              "bw_eff=0.55")
            raise typer.Exit(2) from None
    return out


@labs.command("list")
def list_labs() -> None:
    """List the labs."""
    for name, path in LABS.items():
        typer.echo(f"{name:16s} {getattr(importlib.import_module(path), 'DESCRIPTION', '')}")


@labs.command("run")
def run_lab(
    name: Annotated[str, typer.Argument(help="Lab name (see `workbench labs list`).")],
    backend: Annotated[str, typer.Option(
        help="Backend: sim, or gpu (colocation on a CUDA host, with the mini engine).")] = "sim",
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the JSON record here (the Markdown report beside it, .md).")] = None,
    peaks: Annotated[str | None, typer.Option(
        help="Comma-separated PEAK req/s values (colocation), e.g. 12,14,16.")] = None,
    quick: Annotated[bool, typer.Option(help="A smaller run for CI and a first look.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed (same seed, same result).")] = 0,
    steptime: Annotated[str | None, typer.Option(
        help="Step-time calibration: a name (roofline, kvcached-fit) or key=value pairs, "
             "e.g. bw_eff=0.55,step_overhead_s=0.005.")] = None,
) -> None:
    """Run lab NAME and print its report."""
    mod = _module(name)
    params = inspect.signature(mod.run).parameters
    kw: dict = {"backend": backend, "quick": quick, "seed": seed}
    if peaks is not None:
        try:
            kw["peaks"] = [int(p) for p in peaks.split(",") if p.strip()]
        except ValueError:
            err_console.print(f"error: --peaks {peaks!r} is not a list of integers; "
                              "write e.g. 12,14,16")
            raise typer.Exit(2) from None
    if steptime is not None:
        kw["steptime"] = _steptime(steptime)
    kw = {k: v for k, v in kw.items() if k in params}
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(name, total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{name}: {what}")

        if "progress" in params:
            kw["progress"] = progress
        try:
            record, md = mod.run(**kw)
        except ConfigError as err:
            err_console.print(f"error: {err}")
            raise typer.Exit(2) from None
    typer.echo(md)
    err_console.print(f"{name}: {time.perf_counter() - t0:.1f} s wall")
    if json_out is not None:
        for p in record.write(json_out, md):
            err_console.print(f"wrote {p}")
