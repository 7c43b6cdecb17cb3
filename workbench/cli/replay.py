"""``workbench replay TRACE``: run an op trace on a backend, print its events and final state."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from workbench.backends import BACKENDS, capabilities, make_device
from workbench.cli import app
from workbench.config import format_size
from workbench.core.replay import load_trace, replay
from workbench.errors import WorkbenchError


@app.command("replay")
def replay_cmd(trace: Path = typer.Argument(..., exists=True, dir_okay=False,
                                            help="JSON-lines op trace (see docs/replay.md)."),
               backend: str = typer.Option("sim", help=f"One of {', '.join(BACKENDS)}."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON."),
               events: bool = typer.Option(True, help="Print every event.")) -> None:
    """Replay an op trace and print the state events and each pool's final state."""
    try:
        ops = load_trace(trace)
        if not capabilities(backend).simulated and ops and ops[0].get("op") == "device":
            ops.pop(0)  # device presets describe the simulated GPU only
        result = replay(ops, lambda **kw: make_device(backend, **kw))
    except WorkbenchError as err:  # a bad line, or a pool that cannot be made: one line
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
        return
    console = Console()
    if events:
        t = Table("t (ms)", "pool", "page", "from", "to", "cause")
        for e in result.events:
            t.add_row(f"{e.t * 1e3:.3f}", e.pool, "" if e.page < 0 else str(e.page), e.src,
                      e.dst, e.cause)
        console.print(t)
    for r in result.results:
        if isinstance(r.result, dict) and "error" in r.result:
            console.print(f"[red]line {r.line} {r.op}: {r.result['error']}: "
                          f"{r.result['message']}[/red]", soft_wrap=True)  # one line each
    s = Table("pool", "used blocks", "free", "reserved", "in use", "reclaimed", "quarantined",
              "mapped", "limit", "misses", "failed")
    for name, p in result.pools.items():
        c = p.counts
        s.add_row(name, str(p.used_blocks), str(c["free"]), str(c["reserved"]), str(c["in_use"]),
                  str(c["reclaimed"]), str(c["quarantined"]), format_size(p.mapped_bytes),
                  format_size(p.limit_bytes), str(p.misses), p.failed or "")
    console.print(s)
