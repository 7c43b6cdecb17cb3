"""``workbench kvctl``: list pools, set memory limits, watch, delete and garbage-collect segments.

Every request is validated before anything is written; a bad one exits non-zero with a message
that says what to change. There is no shell passthrough.
"""

from __future__ import annotations

import json
import time

import typer
from rich.console import Console
from rich.table import Table

from workbench.cli import app
from workbench.config import format_size, parse_size
from workbench.core import control
from workbench.errors import ConfigError, ControlError

kvctl = typer.Typer(help="Control elastic KV pools through their shared-memory segments.",
                    no_args_is_help=True)
app.add_typer(kvctl, name="kvctl")
console = Console()


def _fail(err: Exception) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(2)


def _info(name: str) -> control.SegmentInfo:
    try:
        info = control.read_segment(name)
    except (ControlError, ConfigError) as err:
        _fail(err)
    if info is None:
        _fail(ControlError(f"no pool named {name!r} (see `workbench kvctl list`)"))
    return info


def _row(i: control.SegmentInfo) -> dict:
    d = i.to_dict()
    d.pop("page_states")
    return d


@kvctl.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List every pool's segment: owner, limit, used and reserved bytes."""
    infos = control.read_all()
    if as_json:
        typer.echo(json.dumps([_row(i) for i in infos], indent=2))
        return
    t = Table("pool", "pid", "alive", "limit", "used", "reserved", "capacity", "rev", "state")
    for i in infos:
        t.add_row(i.name, str(i.owner_pid), "yes" if i.alive else "NO", format_size(i.limit),
                  format_size(i.used), format_size(i.reserved), format_size(i.capacity),
                  str(i.revision), i.outcome)
    console.print(t if infos else "no pools")


def _apply(name: str, limit: int, as_json: bool, wait: float) -> None:
    try:
        info = control.request_limit(name, limit, wait_s=wait)
    except (ControlError, ConfigError) as err:
        _fail(err)
    acked = info.ack_revision >= info.req_revision
    out = {"pool": name, "requested": limit, "revision": info.req_revision,
           "acknowledged": acked, "outcome": info.outcome if acked else "pending",
           "limit": info.limit, "mapped": info.mapped}
    if as_json:
        typer.echo(json.dumps(out))
    elif acked:
        typer.echo(f"{name}: limit {format_size(limit)} (revision {info.req_revision}) "
                   f"{info.outcome}; mapped now {format_size(info.mapped)}")
    else:
        typer.echo(f"{name}: limit {format_size(limit)} written (revision {info.req_revision});"
                   f" the owner applies it on its next allocation or free")


@kvctl.command()
def limit(name: str = typer.Argument(..., help="IPC name of the pool."),
          size: str = typer.Argument(..., help="New limit, e.g. 8G, 512MiB, 1073741824."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON."),
          wait: float = typer.Option(2.0, help="Seconds to wait for the owner's answer.")) -> None:
    """Set a pool's memory limit in bytes (all layers and buffers)."""
    try:
        nbytes = parse_size(size)
    except ConfigError as err:
        _fail(err)
    _apply(name, nbytes, as_json, wait)


@kvctl.command("limit-percent")
def limit_percent(name: str = typer.Argument(..., help="IPC name of the pool."),
                  percent: float = typer.Argument(..., help="Percent of the pool's capacity."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON."),
                  wait: float = typer.Option(2.0, help="Seconds to wait for the answer.")) -> None:
    """Set a pool's limit as a percentage of its capacity."""
    if not 0 <= percent <= 100:
        _fail(ConfigError(f"percent {percent}", "must be between 0 and 100",
                          "pass e.g. 25 for a quarter of the capacity"))
    info = _info(name)
    _apply(name, int(info.capacity * percent / 100), as_json, wait)


@kvctl.command()
def watch(name: str = typer.Argument(None, help="One pool, or every pool."),
          interval: float = typer.Option(1.0, help="Seconds between samples."),
          count: int = typer.Option(0, help="Samples to print; 0 = until Ctrl-C."),
          as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """Print used/reserved/limit lines as they change."""
    n = 0
    try:
        while count == 0 or n < count:
            names = [name] if name else control.list_segments()
            for nm in names:
                i = _info(nm)
                if as_json:
                    typer.echo(json.dumps({"t": time.time(), **_row(i)}))
                else:
                    typer.echo(f"{time.strftime('%H:%M:%S')} {nm}: used {format_size(i.used)} "
                               f"reserved {format_size(i.reserved)} limit {format_size(i.limit)}"
                               f" ({i.outcome})")
            n += 1
            if count == 0 or n < count:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


@kvctl.command()
def delete(name: str = typer.Argument(..., help="IPC name of the pool."),
           force: bool = typer.Option(False, help="Remove even if its owner is alive.")) -> None:
    """Remove a pool's segment (refuses while its owner is alive unless --force)."""
    try:
        control.delete_segment(name, force=force)
    except (ControlError, ConfigError) as err:
        _fail(err)
    typer.echo(f"deleted {name}")


@kvctl.command()
def gc(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Remove segments and worker socket directories whose owner process is gone."""
    removed = control.gc_segments()
    sockets: list[str] = []
    try:
        from workbench.transport import gc_sockets
    except ImportError:
        gc_sockets = None
    if gc_sockets is not None:
        sockets = gc_sockets()
    if as_json:
        typer.echo(json.dumps({"segments": removed, "socket_dirs": sockets}))
    else:
        typer.echo(f"removed {len(removed)} segment(s) {removed} and {len(sockets)} socket "
                   f"dir(s) {sockets}")
