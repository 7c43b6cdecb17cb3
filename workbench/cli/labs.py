"""``workbench labs list|params NAME|run NAME``: a thin shell over the lab protocol
(workbench.labs).

Labs are numbered as their notebooks (``labs/NN_name.ipynb``): ``labs run 00`` is
``labs run colocation``. Shared options (``--quick``, ``--seed``, ``--engine``), a lab's own
parameter as ``--NAME VALUE`` (colocation's ``--peaks``; ``labs params NAME`` lists them) and
``--param key=value`` fill the lab's parameter dataclass; :func:`workbench.labs.run_lab`
resolves the run before anything runs, so a refused run writes no record.
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
from workbench.cli.common import backend_option, err_console, fail, missing
from workbench.cli.root import app
from workbench.engines.kinds import REGISTRY as KINDS
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


def _lab_options(lab, extra: list[str]) -> dict[str, str]:
    """A lab's own parameters given as ``--NAME VALUE`` (or ``--NAME=VALUE``; ``-`` for
    ``_``): only the lab's, so colocation's ``--peaks`` is refused elsewhere."""
    fields = {f.name for f in dataclasses.fields(lab.params_type)}
    text, items = {}, list(extra)
    while items:
        item = items.pop(0)
        key, sep, value = item[2:].partition("=") if item.startswith("--") else ("", "", "")
        key = key.replace("-", "_")
        if key not in fields:
            raise ConfigError(f"option {item.partition('=')[0]!r} of lab {lab.name!r}",
                              "is not one of its parameters",
                              f"see `workbench labs params {lab.name}`")
        if not sep:
            if not items:
                raise ConfigError(f"option {item!r}", "needs a value",
                                  f"write {item} VALUE")
            value = items.pop(0)
        text[key] = value
    return text


def _param_text(lab, params: list[str], shared: dict[str, str | None],
                extra: list[str] = ()) -> dict[str, str]:
    """``key -> text`` for the lab's dataclass: shared options the lab takes, its own options,
    then --param."""
    fields = {f.name for f in dataclasses.fields(lab.params_type)}
    text = {k: v for k, v in shared.items() if v is not None and k in fields}
    if shared.get("engine") is not None and "engine" not in fields:
        raise ConfigError(f"--engine for lab {lab.name!r}", "the lab runs no engine of a "
                          "kind you pick", "leave --engine out")
    text.update(_lab_options(lab, list(extra)))
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


@labs.command("params", short_help="List a lab's parameters: default, range, help.")
def list_params(
    name: Annotated[str, typer.Argument(
        help="Lab name or number, e.g. colocation or 00 (see workbench labs list).")],
    as_json: bool = typer.Option(False, "--json", help="Print the list as JSON."),
) -> None:
    """List lab NAME's parameters: each one's name, default, declared range and help. Each
    is set with --NAME VALUE or --param NAME=VALUE on labs run."""
    from workbench.labs.kit.params import described

    try:
        rows = described(get_lab(lab_name(name)))
    except ConfigError as err:
        raise fail(err) from None
    if as_json:
        typer.echo(json.dumps(rows))
        return
    wide = max(len(r["name"]) for r in rows)
    for r in rows:
        typer.echo(f"{r['name']:<{wide}}  default {r['default']}")
        typer.echo(f"{'':<{wide}}  range   {r['range']}")
        if r["help"]:
            typer.echo(f"{'':<{wide}}  {r['help']}")


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


@labs.command("run", short_help='Run a lab and print its report.',
              context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_lab(
    ctx: typer.Context,
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
    engine: Annotated[str | None, typer.Option(
        "--engine", metavar="KIND", help=f"The engine kind, one of {', '.join(KINDS)} (the "
        "lab's default when left out; which ones a lab runs: labs params NAME).")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="A smaller run for CI and a first look.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed (same seed, same result).")] = 0,
) -> None:
    """Run lab NAME and print its report (rendered in a terminal, Markdown when piped). A
    lab's own parameters are options too, --NAME VALUE (colocation's --peaks 12,14, say):
    workbench labs params NAME lists them."""
    try:
        name = lab_name(name)
        lab = get_lab(name)
        shared = {"quick": str(quick), "seed": str(seed), "engine": engine}
        params = lab.parse_params(_param_text(lab, param or [], shared, ctx.args))
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
