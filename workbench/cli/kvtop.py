"""``workbench kvtop``: a live terminal view of every pool — bars for used/reserved/limit and a
map of every page id coloured by its state."""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from workbench.cli import app, kvbudget
from workbench.cli.common import console as out_console
from workbench.config import format_size
from workbench.core import control

GLYPHS = {"free": ("·", "grey42"), "reserved": ("○", "yellow"), "in_use": ("█", "green"),
          "retired": ("▒", "magenta"), "reclaimed": ("×", "grey23"), "quarantined": ("!", "red")}


def _bar(parts: list[tuple[int, str]], total: int, width: int) -> Text:
    t = Text()
    used = 0
    for n, style in parts:  # clamped: a bar never grows past its width, whatever the counters
        k = min(max(0, int(width * n / total)) if total else 0, width - used)
        t.append("█" * k, style=style)
        used += k
    t.append("░" * max(0, width - used), style="grey30")
    return t


def render_pool(i: control.SegmentInfo, width: int = 64) -> Panel:
    head = Text(f"pid {i.owner_pid}{'' if i.alive else ' (gone)'}  "
                f"used {format_size(i.used)}  reserved {format_size(i.reserved)}  "
                f"limit {format_size(i.limit)} of {format_size(i.capacity)}  "
                f"rev {i.revision} {i.outcome}")
    bar = _bar([(i.used, "green"), (i.reserved, "yellow")], i.capacity, width)
    limit_mark = Text(" " * min(width - 1, int(width * i.limit / max(i.capacity, 1))) + "▲ limit",
                      style="cyan")
    pages = Text()
    for k, st in enumerate(i.page_states):
        glyph, style = GLYPHS.get(st, ("?", "red"))
        pages.append(glyph, style=style)
        if (k + 1) % width == 0:
            pages.append("\n")
    return Panel(Group(head, bar, limit_mark, pages), title=i.name, title_align="left")


def legend() -> Text:
    t = Text("pages: ")
    for st, (glyph, style) in GLYPHS.items():
        t.append(f"{glyph} {st}  ", style=style)
    t.append("\nbar:   ")
    t.append("█ used  ", style="green")
    t.append("█ reserved  ", style="yellow")
    t.append("░ not mapped", style="grey30")
    return t


def frame(width: int, found: control.Scan | None = None) -> Group:
    """Legend, one panel per pool, then one dim line per entry that was skipped."""
    found = found or control.scan()
    panels = [render_pool(i, width) for i in found.infos] or [Text("no pools")]
    skipped = [Text(str(err), style="grey50") for err in found.skipped]
    return Group(legend(), *kvbudget.panels(width), *panels, *skipped)


@app.command(short_help='Live view of every pool and its pages.')
def kvtop(interval: float = typer.Option(0.5, min=0.01, help="Seconds between refreshes."),
          once: bool = typer.Option(False, "--once", help="Draw one frame and exit."),
          width: int = typer.Option(64, min=1, help="Page map width in pages."),
          as_json: bool = typer.Option(False, "--json", help="Print one JSON snapshot.")) -> None:
    """Live view of every pool on this machine: bars and a per-page state map. Entries in the
    shared-memory directory that are not trustworthy segments are skipped, one line each."""
    if as_json or once:
        found = control.scan()
        for err in found.skipped:  # on stderr: stdout stays one JSON document / one frame
            typer.echo(str(err), err=True)
        if as_json:
            typer.echo(json.dumps([i.to_dict() for i in found.infos]))
        else:
            out_console().print(frame(width, control.Scan(found.infos)))
        return
    console = Console()
    try:
        with Live(frame(width), console=console, refresh_per_second=max(1, int(1 / interval))) \
                as live:
            while True:
                time.sleep(interval)
                live.update(frame(width))
    except KeyboardInterrupt:
        pass
