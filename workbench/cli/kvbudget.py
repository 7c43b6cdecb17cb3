"""``workbench kvctl budget``: each GPU's shared memory budget and who holds what; the budget
lines of ``kvctl list`` and the budget panels of ``kvtop``.

Readers write nothing: ``--gc`` (and ``kvctl gc``) is the one way a dead holder's bytes are
reclaimed from here, and ``--delete`` removes a budget no live process holds bytes of."""

from __future__ import annotations

import json

import typer
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from workbench.cli.common import console as out_console
from workbench.cli.common import fail
from workbench.core import budget_segment as bs
from workbench.errors import ConfigError, ControlError
from workbench.terminal import as_text, plain
from workbench.units import format_size


def _holders(state: bs.BudgetState) -> list[dict]:
    return [{"pid": h.pid, "start": h.start, "alive": h.alive, "held": h.held}
            for _, h in sorted(state.holders.items())]


def as_dict(state: bs.BudgetState) -> dict:
    return {"total": state.total, "held": state.held, "free": max(0, state.total - state.held),
            "holders": _holders(state)}


def table(found: dict[str, bs.BudgetState]) -> Table:
    """One row per GPU budget, then one indented row per holder."""
    t = Table("gpu budget", "pid", "alive", "held", "free", "total")
    for ident, s in found.items():
        t.add_row(as_text(ident), "", "", format_size(s.held),
                  format_size(max(0, s.total - s.held)), format_size(s.total))
        for h in _holders(s):
            t.add_row("", str(h["pid"]), "yes" if h["alive"] else "NO (reclaimable)",
                      format_size(h["held"]), "", "")
    return t


def panels(width: int) -> list[Panel | Text]:
    """kvtop's view: one bar per GPU budget, a segment per holder; a dim line per entry that is
    not a budget."""
    found, skipped = bs.scan_budgets()
    out: list[Panel | Text] = [Text(str(err), style="grey50") for err in skipped]
    for ident, s in found.items():
        bar, used = Text(), 0
        for k, h in enumerate(_holders(s)):
            n = int(width * h["held"] / s.total)
            bar.append("█" * n, style=("green", "cyan", "blue", "magenta")[k % 4]
                       if h["alive"] else "red")
            used += n
        bar.append("░" * max(0, width - used), style="grey30")
        who = "  ".join(f"pid {h['pid']}{'' if h['alive'] else ' (gone)'} "
                        f"{format_size(h['held'])}" for h in _holders(s))
        head = Text(f"held {format_size(s.held)} of {format_size(s.total)}  {who}")
        out.append(Panel(Text.assemble(head, "\n", bar), title=as_text(f"gpu budget {ident}"),
                         title_align="left"))
    return out


def summary() -> None:
    """``kvctl list``'s budget lines: nothing at all when no GPU has a budget."""
    found, skipped = bs.scan_budgets()
    if found:
        out_console().print(table(found))
    for err in skipped:
        typer.echo(str(err), err=True)


def reclaim_all(report: list | None = None) -> dict[str, int]:
    """Reclaim every dead holder's bytes, per GPU budget (what ``kvctl gc`` reports); the
    entries that are not budgets are left alone and added to ``report``."""
    out: dict[str, int] = {}
    bs.gc_partials()  # half-written budgets of creators that are gone
    found, skipped = bs.scan_budgets()
    if report is not None:
        report.extend(skipped)
    for ident in found:
        try:
            b = bs.SharedBudget.open(ident, None)
        except ConfigError:
            continue  # replaced by something else since the scan: left alone
        if b is None:
            continue
        try:
            b.reclaim()
            out[ident] = b.reclaimed  # attaching reclaims too: count both
        except (bs.SegmentRefused, TimeoutError):
            continue
        finally:
            b.close()
    return out


def budget(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
           gc: bool = typer.Option(False, "--gc", help="Reclaim the bytes of holders that are "
                                                       "gone."),
           delete: str = typer.Option(None, "--delete", metavar="GPU",
                                      help="Remove GPU's budget (no live process may hold "
                                           "bytes of it).")) -> None:
    """Each GPU's shared memory budget (WORKBENCH_KV_GPU_BUDGET): the total, what is held, and
    who holds it (pid, alive, bytes)."""
    try:
        if delete is not None:
            gone = bs.delete_budget(delete)
            typer.echo(plain(f"deleted the budget of {delete}" if gone else
                             f"no budget for {delete}"))
            return
        freed = reclaim_all() if gc else {}
    except (ConfigError, ControlError) as err:
        raise fail(err) from None
    found, skipped = bs.scan_budgets()
    if as_json:
        typer.echo(json.dumps({k: {**as_dict(s), **({"reclaimed": freed.get(k, 0)} if gc else {})}
                               for k, s in found.items()}))
    else:
        out_console().print(table(found) if found else "no gpu budgets")
        for ident, n in freed.items():
            typer.echo(plain(f"{ident}: reclaimed {format_size(n)} from holders that are gone"))
    for err in skipped:
        typer.echo(str(err), err=True)
