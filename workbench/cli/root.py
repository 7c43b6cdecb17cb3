"""The ``workbench`` command group, ``app``: every command module registers itself on it, and it
reads the settings once before any command runs. Kept apart from the package's ``__init__``,
which imports every command module, so a command imports this and never its importer."""

from __future__ import annotations

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
