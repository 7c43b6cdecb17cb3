"""``workbench labs list|run NAME``: a thin shell over the lab protocol (:mod:`workbench.labs`).

Shared options (``--quick``, ``--seed``, ``--peaks``, ``--steptime``) and ``--param key=value``
fill the lab's parameter dataclass; the backend is checked before anything runs, so a refused
run writes no record.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from workbench.cli import app
from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab

labs = typer.Typer(help="Run the workbench's labs (experiments with result records).",
                   no_args_is_help=True)
app.add_typer(labs, name="labs")
err_console = Console(stderr=True)


def _fail(err: Exception) -> typer.Exit:
    err_console.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _param_text(lab, params: list[str], shared: dict[str, str | None]) -> dict[str, str]:
    """``key -> text`` for the lab's dataclass: shared options the lab takes, then --param."""
    fields = {f.name for f in dataclasses.fields(lab.params_type)}
    text = {k: v for k, v in shared.items() if v is not None and (k in fields or k in
                                                                  ("peaks", "steptime"))}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--param {item!r}", "is not key=value", "write e.g. seed=1")
        text[key.strip()] = value.strip()
    return text


def _real_engine(name: str, items: list[str]):
    from workbench.labs.vllm_runs.lab import for_engine

    return for_engine(name, dict(i.partition("=")[::2] for i in items if "=" in i))


@labs.command("list")
def list_labs() -> None:
    """List the labs and the backends each runs on."""
    for name in LABS:
        lab = get_lab(name)
        typer.echo(f"{name:16s} [{','.join(lab.backends)}] {lab.description}")


@labs.command("run")
def run_lab(
    name: Annotated[str, typer.Argument(help="Lab name (see `workbench labs list`).")],
    backend: Annotated[str, typer.Option(
        help="Backend: sim, gpu (a CUDA host) or host (CPU), as the lab supports.")] = "sim",
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the JSON record here (the Markdown report beside it, .md).")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="A lab parameter, key=value (repeatable).")] = None,
    peaks: Annotated[str | None, typer.Option(
        help="Comma-separated PEAK req/s values (colocation), e.g. 12,14,16.")] = None,
    quick: Annotated[bool, typer.Option(help="A smaller run for CI and a first look.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed (same seed, same result).")] = 0,
    steptime: Annotated[str | None, typer.Option(
        help="Step-time calibration: a name (roofline, kvcached-fit) or key=value pairs, "
             "e.g. bw_eff=0.55,step_overhead_s=0.005.")] = None,
) -> None:
    """Run lab NAME and print its report."""
    try:
        lab = get_lab(name)
        shared = {"quick": str(quick), "seed": str(seed), "peaks": peaks, "steptime": steptime}
        lab = _real_engine(name, param or []) or lab  # engine=vllm: the real vLLM's run
        params = lab.parse_params(_param_text(lab, param or [], shared))
        lab.check_backend(backend, params)
    except ConfigError as err:
        raise _fail(err) from None
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(name, total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{name}: {what}")

        try:
            result = lab.run(params, backend, progress)
        except ConfigError as err:
            raise _fail(err) from None
    typer.echo(result.markdown)
    err_console.print(f"{name}: {time.perf_counter() - t0:.1f} s wall")
    if json_out is not None:
        for p in result.write(json_out):
            err_console.print(f"wrote {p}")
