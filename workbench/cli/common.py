"""What every command shares: one way to fail, to print JSON or write a record, to show progress
and tables, and the choices its options take.

Conventions (tested in ``tests/cli``): ``--json`` prints JSON to stdout (progress and notes go to
stderr); ``--out PATH`` writes the record; flags are one word (``--once``, ``--verbose``,
``--check``, ``--no-events`` for one that is on by default); a refusal is one ``error:`` line on
stderr with exit status 2, its ``Fix:`` written as command-line options.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

err_console = Console(stderr=True, highlight=False)

# ``backend='sim'`` / ``backend="sim"`` (a library's fix, in Python) -> ``--backend sim``
_KWARG = re.compile(r"\b([a-z_][a-z0-9_]*)=(['\"])([^'\"]*)\2")


def cli_syntax(text: str) -> str:
    """A message's Python keyword hints as command-line options."""
    return _KWARG.sub(lambda m: f"--{m.group(1).replace('_', '-')} {m.group(3)}", text)


def fail(err: Exception | str, code: int = 2) -> typer.Exit:
    """Print ``error: ...`` as one line on stderr; return the Exit to raise."""
    from workbench.terminal import plain

    text = " ".join(str(err).split())
    typer.echo(f"error: {plain(cli_syntax(text))}", err=True)
    return typer.Exit(code)


def checked_out(value: Path | None) -> Path | None:
    """``--out``'s check, before the command runs (:func:`workbench.outfiles.check`)."""
    if value is None:
        return None
    from workbench.errors import ConfigError
    from workbench.outfiles import check

    try:
        return check(value, "--out")
    except ConfigError as err:
        raise fail(err) from None


def out_option(what: str) -> Any:
    """``--out PATH``, checked before the command runs."""
    return typer.Option(None, "--out", help=what, callback=checked_out)


def write_json(obj: Any, out: Path | None) -> None:
    """Write ``obj`` to ``out`` (``--out``) as strict indented JSON, atomically, and say so on
    stderr."""
    if out is None:
        return
    from workbench.outfiles import write_text
    from workbench.strictjson import dumps
    from workbench.terminal import plain

    write_text(out, dumps(obj, indent=2, default=str))
    typer.echo(f"wrote {plain(out)}", err=True)


def emit(res: Any, out: Path | None, as_json: bool, lines: Callable[[Any], Iterable[str]]) -> bool:
    """``--out``: write ``res``; ``--json``: print it; else its summary lines. True when the
    summary was printed (so a command can add its own lines after it)."""
    write_json(res, out)
    if as_json:
        from workbench.strictjson import dumps

        typer.echo(dumps(res, default=str))
        return False
    for line in lines(res):
        typer.echo(line)
    return True


@contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner with the elapsed time on stderr (nothing when stderr is not a terminal); yields
    ``say(message)`` to show what runs now."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task(title, total=None)
        yield lambda msg: bar.update(task, description=f"{title}: {msg}")


def console() -> Console:
    """stdout; not a terminal (a pipe, a file): wide enough that no value is cut."""
    return Console() if sys.stdout.isatty() else Console(width=1000, soft_wrap=True)


def model_names() -> tuple[str, ...]:
    """Registry models the mini engine can build (a Llama-shaped decoder)."""
    from workbench.engines.models import mini_models

    return mini_models()


def choice_option(default: str, values: tuple[str, ...] | list[str], flag: str, what: str) -> Any:
    """An option with a fixed set of values, shown in ``--help`` as ``[a|b]``; any other value
    is the one ``error:`` line every declared range gives (:mod:`workbench.ranges`)."""
    from workbench.ranges import Choice

    return typer.Option(default, flag, metavar="[" + "|".join(values) + "]",
                        parser=Choice(tuple(values)).parser(flag), help=what)


_CUDA_N = re.compile(r"cuda:\d+")


def backend_option(default: str, allowed: tuple[str, ...], what: str) -> Any:
    """``--backend``: one of ``allowed`` (``cuda:N`` where ``gpu`` is), shown in ``--help``; any
    other name is one ``error:`` line, as every refusal."""
    shown = [*allowed, "cuda:N"] if "gpu" in allowed else list(allowed)

    def check(value: str) -> str:
        from workbench.backends import kind
        from workbench.errors import WorkbenchError
        from workbench.ranges import Choice

        try:
            k = kind(value)
        except WorkbenchError:  # the registry's reason, in the declared-range form
            raise fail(Choice(tuple(shown)).refuse(value, "--backend", "unknown device name")) \
                from None
        if k not in allowed:
            raise fail(Choice(tuple(shown)).refuse(value, "--backend",
                                                   "not a backend this command runs on"))
        return value

    return typer.Option(default, "--backend", metavar="[" + "|".join(shown) + "]",
                        callback=check, help=what)


def device_option() -> Any:
    """``serve --device``: auto, cpu, cuda or cuda:N (one ``error:`` line for anything else)."""
    def check(value: str) -> str:
        if value in ("auto", "cpu", "cuda") or _CUDA_N.fullmatch(value):
            return value
        from workbench.ranges import Choice

        raise fail(Choice(("auto", "cpu", "cuda", "cuda:N")).refuse(
            value, "--device", "not a device the mini engine runs on"))

    return typer.Option("auto", metavar="[auto|cpu|cuda|cuda:N]", callback=check,
                        help="Where the model runs: auto (cuda when available), cpu, cuda, "
                             "or cuda:N (GPU N).")


def requires(module: str, command: str, why: str, fix: str) -> None:
    """Refuse in one line when ``module`` cannot be imported: what, why, and the fix."""
    from importlib.util import find_spec

    try:
        found = find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise fail(f"`workbench {command}` needs {module}, which is not installed here: {why}. "
                   f"Fix: {fix}")


TORCH_FIX = "pip install 'kv-cache-workbench[torch]' (in a checkout: make torch)"


def requires_torch(command: str, why: str = "the mini engine runs on it") -> None:
    requires("torch", command, why, TORCH_FIX)


# what each optional module is for, and how to get it
EXTRAS = {"torch": ("the mini engine and the host device's tensor views run on it", TORCH_FIX),
          "cuda": ("it calls the CUDA driver", "pip install 'kv-cache-workbench[gpu]' on a CUDA "
                   "host, or use --backend sim")}


def missing(err: ImportError, command: str) -> typer.Exit | ImportError:
    """An optional module found missing mid-command as one ``error:`` line (what, why, fix);
    any other ImportError is returned to be raised as it is."""
    top = (err.name or "").split(".")[0]
    if top not in EXTRAS:
        return err
    why, fix = EXTRAS[top]
    return fail(f"`workbench {command}` needs {top}, which is not installed here: {why}. "
                f"Fix: {fix}")
