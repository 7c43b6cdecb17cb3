"""``workbench replay TRACE``: run an op trace on a backend, print its events and final state."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from workbench.backends import BACKENDS, capabilities, make_device
from workbench.cli.common import backend_option, console, fail, out_option, write_json
from workbench.cli.root import app
from workbench.core.replay import load_trace, replay
from workbench.errors import WorkbenchError
from workbench.terminal import as_text
from workbench.units import format_size


@app.command("replay", short_help='Replay an op trace on a backend.')
def replay_cmd(trace: Path = typer.Argument(..., exists=True, dir_okay=False,
                                            help="JSON-lines op trace (see docs/replay.md)."),
               backend: str = backend_option("sim", tuple(BACKENDS), "Where the trace runs."),
               as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
               out: Path | None = out_option("Write the result as JSON to this file."),
               no_events: bool = typer.Option(False, "--no-events",
                                              help="Leave out the table of events.")) -> None:
    """Replay an op trace and print the state events and each pool's final state."""
    try:
        ops = load_trace(trace)
        if not capabilities(backend).simulated and ops and ops[0].get("op") == "device":
            ops.pop(0)  # device presets describe the simulated GPU only
        result = replay(ops, lambda **kw: make_device(backend, **kw))
    except WorkbenchError as err:  # a bad line, or a pool that cannot be made: one line
        raise fail(err) from None
    write_json(result.to_dict(), out)
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
        return
    con = console()
    if not no_events:  # pool names come from the trace: cells are text, never markup
        t = Table("t (ms)", "pool", "page", "from", "to", "cause")
        for e in result.events:
            t.add_row(f"{e.t * 1e3:.3f}", as_text(e.pool), "" if e.page < 0 else str(e.page),
                      e.src, e.dst, as_text(e.cause))
        con.print(t)
    for r in result.results:
        if isinstance(r.result, dict) and "error" in r.result:
            con.print(as_text(f"line {r.line} {r.op}: {r.result['error']}: "
                              f"{r.result['message']}", style="red"), soft_wrap=True)
    s = Table("pool", "used blocks", "free", "reserved", "in use", "reclaimed", "quarantined",
              "mapped", "limit", "misses", "failed")
    for name, p in result.pools.items():
        c = p.counts
        s.add_row(as_text(name), str(p.used_blocks), str(c["free"]), str(c["reserved"]),
                  str(c["in_use"]), str(c["reclaimed"]), str(c["quarantined"]),
                  format_size(p.mapped_bytes), format_size(p.limit_bytes), str(p.misses),
                  as_text(p.failed or ""))
    con.print(s)
