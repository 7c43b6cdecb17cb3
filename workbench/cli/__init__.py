"""The ``workbench`` console script. One module per command; each registers itself on ``app``."""

from __future__ import annotations

import errno
import sys

import typer
from typer.core import TyperGroup

from workbench.errors import WorkbenchError
from workbench.terminal import plain

# commands that read the settings themselves: doctor reports a bad or unknown name, not refuses
SETTINGS_OWN = ("doctor",)


class _SettingsFirst(TyperGroup):
    """The one reading of ``WORKBENCH_KV_*`` for every command, before it runs: a bad value or an
    unknown name is one ``error:`` line and exit 2, for ``serve`` and ``replay`` as for
    ``kvctl``. ``--help`` still shows help."""

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003 - click's signature
        super().__init__(*args, **kwargs)
        from workbench.cli.metavars import readable

        readable(self)  # the whole tree is built by now: every subcommand is in self.commands

    def resolve_command(self, ctx, args):  # noqa: ANN001 - click's signature
        name, cmd, rest = super().resolve_command(ctx, args)
        if name not in SETTINGS_OWN and not {"--help", "-h"} & set(rest):
            from workbench.settings import settings

            try:
                settings()
            except WorkbenchError as err:
                typer.echo(f"error: {plain(' '.join(str(err).split()))}", err=True)
                raise typer.Exit(2) from None
        return name, cmd, rest

    def invoke(self, ctx):  # noqa: ANN001 - click's signature
        """A usage error anywhere below (a missing argument, an unknown option) is one line too,
        like every other refusal, instead of click's usage block."""
        usage_error = typer.BadParameter.__mro__[1]  # click's UsageError, wherever typer keeps it
        try:
            return super().invoke(ctx)
        except usage_error as err:
            where = err.ctx.command_path if err.ctx is not None else ctx.command_path
            typer.echo(f"error: {plain(' '.join(err.format_message().split()))} "
                       f"Fix: see {where} --help", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(
    name="workbench",
    cls=_SettingsFirst,
    help="KV Cache Workbench: elastic KV-cache memory for LLM serving, simulated and on GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: full option names and values when piped, as click
    context_settings={"max_content_width": 100},
)



def _print_version(flag: bool) -> None:
    if flag:
        from workbench import __version__

        typer.echo(f"workbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True,
                                       callback=_print_version,
                                       help="Print the version and exit.")) -> None:
    """KV Cache Workbench: elastic KV-cache memory for LLM serving, simulated and on GPUs."""


# Each import adds its command(s) to ``app``; keep one line per command module. A bad
# WORKBENCH_KV_* value read while importing (the shm directory) is kept for main() to report in
# one line, as any other WorkbenchError is.
_startup_error: WorkbenchError | None = None
try:
    from workbench.cli import bench as _bench  # noqa: F401
    from workbench.cli import doctor as _doctor  # noqa: F401
    from workbench.cli import kvctl as _kvctl  # noqa: F401
    from workbench.cli import kvexport as _kvexport  # noqa: F401
    from workbench.cli import kvtop as _kvtop  # noqa: F401
    from workbench.cli import lab as _lab  # noqa: F401
    from workbench.cli import labs as _labs  # noqa: F401
    from workbench.cli import replay as _replay  # noqa: F401
    from workbench.cli import serve as _serve  # noqa: F401
except WorkbenchError as err:
    _startup_error = err


def main() -> None:
    """Run the CLI; a WorkbenchError that no command caught is one ``error:`` line, exit 2;
    stdout that takes nothing more (closed, a full device) ends it quietly, exit 1."""
    from workbench.outfiles import StdoutLost, drop_stdout, guard_stdout

    guard_stdout()
    try:
        try:
            _run()
        finally:
            sys.stdout.flush()
    except StdoutLost as err:
        drop_stdout()
        if err.errno != errno.EPIPE:  # a closed pipe is the reader's choice; the rest is said
            try:
                print(f"error: stdout: {err.strerror}", file=sys.stderr)
            except OSError:
                pass
        raise SystemExit(1) from None


def _run() -> None:
    try:
        if _startup_error is not None:
            raise _startup_error
        app()
    except WorkbenchError as err:
        from workbench.cli.common import cli_syntax

        print(f"error: {plain(cli_syntax(' '.join(str(err).split())))}", file=sys.stderr)
        raise SystemExit(2) from None
    except ImportError as err:  # an optional module (torch, cuda-python) a command needs
        from workbench.cli.common import missing

        found = missing(err, " ".join(sys.argv[1:3]))
        if isinstance(found, ImportError):
            raise
        raise SystemExit(found.exit_code) from None
