"""The ``workbench`` console script. One module per command; each registers itself on ``app``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="workbench",
    help="KV Cache Workbench: elastic KV-cache memory for LLM serving, simulated and on GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each import adds its command(s) to ``app``; keep one line per command module.
from workbench.cli import bench as _bench  # noqa: E402,F401
from workbench.cli import doctor as _doctor  # noqa: E402,F401
from workbench.cli import kvctl as _kvctl  # noqa: E402,F401
from workbench.cli import kvexport as _kvexport  # noqa: E402,F401
from workbench.cli import kvtop as _kvtop  # noqa: E402,F401
from workbench.cli import lab as _lab  # noqa: E402,F401
from workbench.cli import labs as _labs  # noqa: E402,F401
from workbench.cli import replay as _replay  # noqa: E402,F401
from workbench.cli import serve as _serve  # noqa: E402,F401


def main() -> None:
    app()
