"""``workbench kvctl export``: every KV pool on this host as Prometheus metrics.

The same ``workbench_kv_*_bytes{pool}`` gauges as the mini server's ``/metrics``, read from the
pools' control segments at each scrape (``control.read_all``: segments it skips are skipped here),
so an engine's elastic KV shows up in the dashboards its operators already have.
"""

from __future__ import annotations

import typer

from workbench.cli.common import fail
from workbench.cli.kvctl import kvctl


@kvctl.command("export", short_help="Serve every pool's bytes for Prometheus.")
def export(
    port: int = typer.Option(9400, help="Port to serve /metrics on (0 picks a free one)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    verbose: bool = typer.Option(False, "--verbose", help="Log every scrape."),
) -> None:
    """Serve every pool's mapped, reserved, used, limit and capacity bytes for Prometheus."""
    from prometheus_client import make_asgi_app

    from workbench.errors import ConfigError
    from workbench.observe.asgi import bind_socket, make_server
    from workbench.observe.metrics import export_registry

    try:
        sock = bind_socket(host, port)
    except ConfigError as err:
        raise fail(err) from None
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"exporting KV pool metrics at http://{shown}:{sock.getsockname()[1]}/metrics",
               nl=True)
    make_server(make_asgi_app(registry=export_registry()), verbose,
                max_connections=64).run(sockets=[sock])
