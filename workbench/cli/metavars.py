"""Readable metavars in every command's help, as argparse (and so vLLM) writes them:
``--port PORT``, ``--kv-memory KV_MEMORY``, an argument ``NAME`` in the usage line, instead of
typer's ``<int>``, ``<list[str]>`` and ``{name}``. Choices keep their ``[a|b]`` list, and an
option that names its own metavar keeps it. Applied once to the built command tree."""

from __future__ import annotations

from typing import Any


def _argument_usage(self: Any) -> str:
    name = self.metavar or self.name.upper()
    return name if self.required else f"[{name}]"


def _fix(param: Any) -> None:
    if param.metavar is not None or getattr(param, "is_flag", False):
        return
    if param.param_type_name == "argument":
        param.metavar = param.name.upper()
        # the usage line's piece: NAME, [NAME] when optional (typer writes {name})
        param._usage_display_name = _argument_usage.__get__(param)
        param.display_type_rich = lambda ctx: None  # "NAME  help", not "NAME <str>  help"
        return
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and desc.is_choice:
        return
    param.metavar = (param.name or "value").upper()


def readable(cmd: Any) -> None:
    """Every parameter of ``cmd`` and of every command below it, in place."""
    for param in cmd.params:
        _fix(param)
    for sub in getattr(cmd, "commands", {}).values():
        readable(sub)
