"""``workbench kvctl``: list pools, set memory limits, watch, delete and garbage-collect segments.

Every request is validated before anything is written; a bad one exits non-zero with a message
that says what to change. There is no shell passthrough.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import typer
from rich.table import Table

import workbench.cli.kvbudget as kvbudget  # by its full name: the package imports this module
from workbench.cli.common import console as out_console
from workbench.cli.common import fail
from workbench.cli.root import app
from workbench.core import control, limit_requests
from workbench.core.segment import SHM_DIR
from workbench.errors import ConfigError, ControlError
from workbench.ranges import Num
from workbench.terminal import plain
from workbench.units import align_down, format_size, parse_size

kvctl = typer.Typer(help="Control elastic KV pools through their shared-memory segments.",
                    no_args_is_help=True, rich_markup_mode=None)
app.add_typer(kvctl, name="kvctl")
WAIT = Num(float, 0, 3600, "seconds")  # declared ranges: refused in one line before anything
INTERVAL = Num(float, 0.01, 3600, "seconds")
DURATION = Num(float, 0, 366 * 86400, "seconds")
COUNT = Num(int, 0, 1 << 40)
EXIT_CODES = {limit_requests.ACKNOWLEDGED: 0, limit_requests.PENDING: 0,
              limit_requests.SUPERSEDED: 3, limit_requests.REFUSED: 4}


def _fail(err: Exception) -> None:
    if isinstance(err, control.SegmentRefused):  # named on purpose: not "skipped", refused
        err = ControlError(f"{err.path} is not a usable segment: {err.detail}")
    raise fail(err)


def _info(name: str) -> control.SegmentInfo:
    try:
        info = control.read_segment(name)
    except (ControlError, ConfigError) as err:
        _fail(err)
    if info is None:
        _fail(ControlError(f"no pool named {name} on this machine. Fix: use a name from "
                           "`workbench kvctl list`"))
    return info


def _row(i: control.SegmentInfo) -> dict:
    d = i.to_dict()
    d.pop("page_states")
    return d


def report_skipped(skipped: list[control.SegmentRefused], verbose: bool) -> None:
    """One line per skipped entry with ``verbose``, else one line counting them by reason."""
    if verbose:
        for err in skipped:
            typer.echo(str(err), err=True)
    elif skipped:
        kinds = Counter(err.kind for err in skipped)
        why = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        typer.echo(f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'} in "
                   f"{SHM_DIR} that are not segments of yours ({why}); --verbose names them",
                   err=True)


@kvctl.command("list", short_help="List every pool's segment.")
def list_(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
          verbose: bool = typer.Option(False, "--verbose", "-v",
                                       help="Name every skipped entry and why.")) -> None:
    """List every pool's segment: owner, limit, used and reserved bytes."""
    found = control.scan()
    infos = found.infos
    if as_json:
        typer.echo(json.dumps([_row(i) for i in infos], indent=2))
    else:
        t = Table("pool", "pid", "alive", "limit", "used", "reserved", "capacity", "rev", "state")
        for i in infos:
            t.add_row(i.name, str(i.owner_pid), "yes" if i.alive else "NO", format_size(i.limit),
                      format_size(i.used), format_size(i.reserved), format_size(i.capacity),
                      str(i.revision), i.outcome)
        out_console().print(t if infos else "no pools")
        kvbudget.summary()
    report_skipped(found.skipped, verbose)


def _apply(name: str, limit: int, as_json: bool, wait: float) -> None:
    try:
        a = limit_requests.request_limit(name, limit, wait_s=wait)
    except (ControlError, ConfigError) as err:
        _fail(err)
    if as_json:
        typer.echo(json.dumps(a.to_dict()))
    else:
        typer.echo(_say(a))
    raise typer.Exit(EXIT_CODES[a.answer])


def _say(a: limit_requests.LimitAnswer) -> str:
    head = f"{a.pool}: limit {format_size(a.requested)} (revision {a.revision}, " \
           f"request {a.request_id:016x})"
    if a.answer == limit_requests.ACKNOWLEDGED:
        return f"{head} acknowledged: {a.outcome}; mapped now {format_size(a.info.mapped)}"
    if a.answer == limit_requests.SUPERSEDED:
        return (f"{head} superseded by revision {a.superseded_by_revision} (request "
                f"{a.superseded_by_request:016x}, {a.outcome}); the limit in force is "
                f"{format_size(a.info.limit)}")
    if a.answer == limit_requests.REFUSED:
        return f"{head} refused by the owner: {a.outcome}"
    return f"{head} written; the owner applies it on its next allocation or free"


@kvctl.command(short_help="Set a pool's memory limit in bytes.")
def limit(name: str = typer.Argument(..., help="IPC name of the pool."),
          size: str = typer.Argument(..., help="New limit, e.g. 8G, 512MiB, 1073741824."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON."),
          wait: float = typer.Option(2.0, parser=WAIT.parser("--wait"),
                                     help="Seconds to wait for the owner's answer.")) -> None:
    """Set a pool's memory limit in bytes (all layers and buffers).

    Exit status: 0 acknowledged (or still pending after --wait), 2 bad request (nothing
    written), 3 superseded by a later request, 4 refused by the owner."""
    try:
        nbytes = parse_size(size)
    except ConfigError as err:
        _fail(err)
    _apply(name, nbytes, as_json, wait)


@kvctl.command("limit-percent", short_help="Set a pool's limit as a percentage.")
def limit_percent(name: str = typer.Argument(..., help="IPC name of the pool."),
                  percent: float = typer.Argument(..., help="Percent of the pool's capacity."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                  wait: float = typer.Option(2.0, parser=WAIT.parser("--wait"),
                                             help="Seconds to wait for the answer.")) -> None:
    """Set a pool's limit as a percentage of its capacity, rounded down to whole page ids (exit
    status as for `limit`)."""
    if not 0 <= percent <= 100:
        _fail(ConfigError(f"percent {percent}", "must be between 0 and 100",
                          "pass e.g. 25 for a quarter of the capacity"))
    info = _info(name)  # whole page ids, rounded down: the answer names the bytes asked for
    _apply(name, align_down(int(info.capacity * percent / 100), info.page_id_bytes), as_json, wait)


def _sample(name: str | None, seen: set[str]) -> list[control.SegmentInfo]:
    """This sample's pools; a skipped entry is reported once per watch, a vanished pool is
    simply gone."""
    if name is not None:
        return [_info(name)]
    found = control.scan()
    fresh = [err for err in found.skipped if err.path not in seen]
    seen.update(err.path for err in fresh)
    report_skipped(fresh, verbose=True)
    return found.infos


@kvctl.command(short_help="Print a pool's bytes as they change.")
def watch(name: str = typer.Argument(None, help="One pool, or every pool."),
          interval: float = typer.Option(1.0, parser=INTERVAL.parser("--interval"),
                                         help="Seconds between samples."),
          count: int = typer.Option(0, parser=COUNT.parser("--count"),
                                    help="Samples to print; 0 = until Ctrl-C."),
          duration: float = typer.Option(0.0, parser=DURATION.parser("--duration"),
                                         help="Stop after this many seconds; 0 = no limit."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """Print used/reserved/limit lines as they change (until --count or --duration)."""
    n, seen = 0, set()
    end = time.monotonic() + duration if duration else float("inf")
    try:
        while (count == 0 or n < count) and time.monotonic() < end:
            for i in _sample(name, seen):
                if as_json:
                    typer.echo(json.dumps({"t": time.time(), **_row(i)}))
                else:
                    typer.echo(f"{time.strftime('%H:%M:%S')} {i.name}: used {format_size(i.used)}"
                               f" reserved {format_size(i.reserved)} limit "
                               f"{format_size(i.limit)} ({i.outcome})")
            n += 1
            if count == 0 or n < count:
                time.sleep(max(0.0, min(interval, end - time.monotonic())))
    except KeyboardInterrupt:
        pass


@kvctl.command(short_help="Remove a pool's segment.")
def delete(name: str = typer.Argument(..., help="IPC name of the pool."),
           force: bool = typer.Option(False, "--force",
                                      help="Remove even if its owner is alive.")) -> None:
    """Remove a pool's segment (refuses while its owner is alive unless --force)."""
    try:
        control.delete_segment(name, force=force)
    except (ControlError, ConfigError) as err:
        _fail(err)
    typer.echo(f"deleted {name}")


@kvctl.command(short_help='Remove what dead owners left behind.')
def gc(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
       verbose: bool = typer.Option(False, "--verbose", "-v",
                                    help="Name every entry left alone and why.")) -> None:
    """Remove segments and worker socket directories whose owner process is gone (pid and start
    time); what is not provably yours and dead is left alone."""
    skipped: list[control.SegmentRefused] = []
    removed = control.gc_segments(report=skipped)
    reclaimed = kvbudget.reclaim_all(report=skipped)  # dead holders' bytes of every GPU budget
    sockets: list[str] = []
    left: list[str] = []
    problem: Exception | None = None
    try:
        from workbench.transport.paths import gc_sockets  # the transport loads only for gc

        sockets = gc_sockets(report=left)
    except (ConfigError, OSError) as err:  # the socket base itself: an error, not "left alone"
        problem = err
    if as_json:
        typer.echo(json.dumps({"segments": removed, "socket_dirs": sockets,
                               "skipped": [str(e) for e in skipped] + left,
                               "budget_reclaimed": reclaimed}))
    else:
        typer.echo(f"removed {len(removed)} segment(s) {removed} and {len(sockets)} socket "
                   f"dir(s) {sockets}")
        for gpu, n in ((g, n) for g, n in reclaimed.items() if n):
            typer.echo(plain(f"gpu budget {gpu}: reclaimed {format_size(n)} from holders that "
                             "are gone"))
    report_skipped(skipped, verbose)
    if verbose:
        for line in left:
            typer.echo(line, err=True)
    elif left:
        typer.echo(f"left {len(left)} socket director{'y' if len(left) == 1 else 'ies'} alone "
                   f"(not provably yours and dead); --verbose names them", err=True)
    if problem is not None:
        _fail(problem)


kvctl.command("budget", short_help="Each GPU's shared memory budget and who holds it.")(
    kvbudget.budget)
