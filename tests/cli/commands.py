"""Every command of the ``workbench`` console script, as click sees it."""

from __future__ import annotations

from collections.abc import Iterator

import typer

from workbench.cli import app


def walk(cmd=None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """(argv path, command) for the root, every group and every leaf command."""
    cmd = cmd or typer.main.get_command(app)
    yield path, cmd
    if is_group(cmd):
        for name, sub in sorted(cmd.commands.items()):
            yield from walk(sub, (*path, name))


def is_group(cmd) -> bool:
    return hasattr(cmd, "commands")  # typer may carry its own copy of click: no isinstance


def leaves() -> list[tuple[tuple[str, ...], object]]:
    return [(p, c) for p, c in walk() if not is_group(c)]


def options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]


def option(cmd, name: str):
    return next((p for p in options(cmd) if name in p.opts), None)
