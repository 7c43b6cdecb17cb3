"""``workbench labs list|run NAME``: a thin shell over the lab protocol (workbench.labs).

Labs are numbered as their notebooks (``labs/NN_name.ipynb``): ``labs run 00`` is
``labs run colocation``. Shared options (``--quick``, ``--seed``, ``--peaks``, ``--steptime``)
and ``--param key=value`` fill the lab's parameter dataclass;
:func:`workbench.labs.run_lab` checks the backend before
anything runs, so a refused run writes no record.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from workbench import labs as registry
from workbench.cli import app
from workbench.cli.common import backend_option, err_console, fail, missing
from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab
from workbench.labs.kit.record import destinations
from workbench.outfiles import Outputs, write_all
from workbench.terminal import plain
from workbench.viz.labpage import PAGE

labs = typer.Typer(help="Run the workbench's labs (experiments with result records).",
                   no_args_is_help=True, rich_markup_mode=None)
app.add_typer(labs, name="labs")


def lab_name(key: str) -> str:
    """A lab's name from its name or its notebook number (``00``, ``7``)."""
    names = list(LABS)
    if key.isdigit():
        if int(key) < len(names):
            return names[int(key)]
        raise ConfigError(f"lab {key}", f"there are labs 00 to {len(names) - 1:02d}",
                          "see `workbench labs list`")
    return key


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


@labs.command("list", short_help='List the labs, numbered as the notebooks.')
def list_labs(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")
              ) -> None:
    """List the labs, numbered as their notebooks, with the backends each runs on."""
    rows = [(f"{i:02d}", name, ",".join(get_lab(name).backends), get_lab(name).description)
            for i, name in enumerate(LABS)]
    if as_json:
        typer.echo(json.dumps([{"number": n, "name": name, "backends": b.split(","),
                                "description": d} for n, name, b, d in rows]))
        return
    wide = max(len(r[1]) for r in rows)
    back = max(len(r[2]) for r in rows)
    for n, name, b, d in rows:
        typer.echo(f"{n}  {name:<{wide}}  {b:<{back}}  {d}")


def _render(markdown: str) -> None:
    """The report: rendered in a terminal, the Markdown itself when piped."""
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(markdown))
    else:
        typer.echo(markdown)


def _outputs(name: str, out: Path | None, html: Path | None) -> list[Path]:
    """Every file the run will write, checked before it runs (:mod:`workbench.outfiles`): the
    record and its report (``--out``), the page in ``--html``'s folder; no two the same."""
    outputs = Outputs()
    record = destinations(out, True, outputs) if out is not None else []
    if html is not None:
        outputs.folder(html, [PAGE], "--html")
    return record


def _files(result, name: str, out: Path | None, html: Path | None) -> list[tuple[Path, str]]:
    """(path, text) of every output: the record and its report; the offline page."""
    files: list[tuple[Path, str]] = []
    if out is not None:
        files += result.record.files(out, result.markdown)
    if html is not None:
        from workbench.viz.labpage import page_html  # plotly.js is read only for --html

        files.append((html / PAGE, page_html(f"workbench lab {name}", result.markdown,
                                             result.figures)))
    return files


@labs.command("run", short_help='Run a lab and print its report.')
def run_lab(
    name: Annotated[str, typer.Argument(
        help="Lab name or number, e.g. colocation or 00 (see workbench labs list).")],
    backend: str = backend_option("sim", ("sim", "host", "gpu"),
                                  "Where the lab runs, as the lab supports (see labs list)."),
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the JSON record on stdout instead of the report.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write the JSON record here (the Markdown report beside it, .md).")] = None,
    html: Annotated[Path | None, typer.Option(
        "--html", help="Write the report with its figures as one offline page, "
                       "DIR/index.html.", metavar="DIR")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="A lab parameter, key=value (repeatable).")] = None,
    peaks: Annotated[str | None, typer.Option(
        help="Comma-separated PEAK req/s values (colocation), e.g. 12,14,16.")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="A smaller run for CI and a first look.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed (same seed, same result).")] = 0,
    steptime: Annotated[str | None, typer.Option(
        help="Step-time calibration: a name (roofline, kvcached-fit) or key=value pairs, "
             "e.g. bw_eff=0.55,step_overhead_s=0.005.")] = None,
) -> None:
    """Run lab NAME and print its report (rendered in a terminal, Markdown when piped)."""
    try:
        name = lab_name(name)
        lab = get_lab(name)
        shared = {"quick": str(quick), "seed": str(seed), "peaks": peaks, "steptime": steptime}
        params = lab.parse_params(_param_text(lab, param or [], shared))
        _outputs(name, out, html)
    except ConfigError as err:
        raise fail(err) from None
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task(name, total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{name}: {what}")

        try:
            result = registry.run_lab(name, params, backend, progress)
        except ConfigError as err:
            raise fail(err) from None
        except ImportError as err:  # torch: the mini engine behind this lab on this backend
            raise missing(err, f"labs run {name} --backend {backend}") from None
    if as_json:
        typer.echo(result.record.to_json(indent=None))
    else:
        _render(result.markdown)
    err_console.print(f"{name}: {time.perf_counter() - t0:.1f} s wall")
    try:
        written = write_all(_files(result, name, out, html))
    except ConfigError as err:
        raise fail(err) from None
    for p in written:
        err_console.print(f"wrote {plain(p)}", markup=False, highlight=False)
