"""``workbench kvtop``: a live terminal view of every pool — bars for used/reserved/limit and a
map of every page id coloured by its state."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

import workbench.cli.kvbudget as kvbudget  # by its full name: the package imports this module
from workbench.cli.root import app
from workbench.core import control
from workbench.units import format_size

GLYPHS = {"free": ("·", "grey42"), "reserved": ("○", "yellow"), "in_use": ("█", "green"),
          "retired": ("▒", "magenta"), "reclaimed": ("×", "grey23"), "quarantined": ("!", "red")}
# The bar's glyphs: used and reserved told apart by shape as well as colour.
BAR = {"used": ("█", "green"), "reserved": ("▓", "yellow"), "unmapped": ("░", "grey30")}
PANEL_EDGE = 4  # a panel's border and padding, both sides


def fit(width: int, columns: int) -> int:
    """The bar and page-map width: ``width`` pages, at most what a panel fits in ``columns``."""
    return max(1, min(width, columns - PANEL_EDGE))


def column(n: int, total: int, width: int) -> int:
    """How many of ``width`` bar columns ``n`` of ``total`` fills (rounded, never past the end)."""
    return min(width, round(width * n / total)) if total else 0


def _bar(used: int, reserved: int, total: int, width: int) -> Text:
    t = Text()
    a = column(used, total, width)
    b = column(used + reserved, total, width)
    for glyph_style, k in ((BAR["used"], a), (BAR["reserved"], b - a),
                           (BAR["unmapped"], width - b)):
        glyph, style = glyph_style
        t.append(glyph * k, style=style)
    return t


def limit_mark(limit: int, total: int, width: int) -> Text:
    """``▲`` under the bar column where the limit falls, its label on the side that fits."""
    at = min(width - 1, column(limit, total, width))
    label = "limit"
    if at + 2 + len(label) <= width:
        return Text(" " * at + "▲ " + label, style="cyan")
    if at >= len(label) + 1:
        return Text(" " * (at - len(label) - 1) + label + " ▲", style="cyan")
    return Text(" " * at + "▲", style="cyan")  # too narrow for the word


def render_pool(i: control.SegmentInfo, width: int = 64) -> Panel:
    head = Text(f"pid {i.owner_pid}{'' if i.alive else ' (gone)'}  "
                f"used {format_size(i.used)}  reserved {format_size(i.reserved)}  "
                f"limit {format_size(i.limit)} of {format_size(i.capacity)}  "
                f"rev {i.revision} {i.outcome}")
    bar = _bar(i.used, i.reserved, i.capacity, width)
    pages = Text()
    for k, st in enumerate(i.page_states):
        glyph, style = GLYPHS.get(st, ("?", "red"))
        pages.append(glyph, style=style)
        if (k + 1) % width == 0 and k + 1 < len(i.page_states):
            pages.append("\n")
    return Panel(Group(head, bar, limit_mark(i.limit, i.capacity, width), pages),
                 title=i.name, title_align="left")


def legend() -> Text:
    t = Text("pages: ")
    for st, (glyph, style) in GLYPHS.items():
        t.append(f"{glyph} {st}  ", style=style)
    t.append("\nbar:   ")
    for what, (glyph, style) in BAR.items():
        t.append(f"{glyph} {what.replace('unmapped', 'not mapped')}  ", style=style)
    t.append("(q quits)", style="grey50")
    return t


def frame(width: int, found: control.Scan | None = None) -> Group:
    """Legend, one panel per pool, then one dim line per entry that was skipped."""
    found = found or control.scan()
    panels = [render_pool(i, width) for i in found.infos] or [Text("no pools")]
    skipped = [Text(str(err), style="grey50") for err in found.skipped]
    return Group(legend(), *kvbudget.panels(width), *panels, *skipped)


@contextmanager
def keys() -> Iterator[Callable[[float], str]]:
    """``wait(seconds) -> key`` ('' when none came): stdin in cbreak mode while kvtop runs, so a
    single ``q`` quits; without a terminal on stdin it only sleeps."""
    if not sys.stdin.isatty():
        yield lambda t: time.sleep(t) or ""
        return
    import select
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield lambda t: os.read(fd, 1).decode(errors="replace") \
            if select.select([fd], [], [], t)[0] else ""
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@app.command(short_help='Live view of every pool and its pages.')
def kvtop(interval: float = typer.Option(0.5, min=0.01, help="Seconds between refreshes."),
          once: bool = typer.Option(False, "--once", help="Draw one frame and exit."),
          width: int = typer.Option(64, min=1, help="Page map width in pages (at most what "
                                                    "the terminal, or COLUMNS, fits)."),
          as_json: bool = typer.Option(False, "--json", help="Print one JSON snapshot.")) -> None:
    """Live view of every pool on this machine: bars and a per-page state map; q quits.
    Entries in the shared-memory directory that are not trustworthy segments are skipped, one
    line each."""
    console = Console()  # a terminal's width; piped, COLUMNS (else 80)
    asked, width = width, fit(width, console.width)
    if as_json or once:
        found = control.scan()
        for err in found.skipped:  # on stderr: stdout stays one JSON document / one frame
            typer.echo(str(err), err=True)
        if as_json:
            typer.echo(json.dumps([i.to_dict() for i in found.infos]))
        else:
            console.print(frame(width, control.Scan(found.infos)))
        return
    try:
        with keys() as wait, Live(frame(width), console=console,
                                  refresh_per_second=max(1, int(1 / interval))) as live:
            while wait(interval).lower() != "q":
                live.update(frame(fit(asked, console.width)))  # a resize is followed
    except KeyboardInterrupt:
        pass
