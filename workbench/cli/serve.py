"""``workbench serve``: the mini engine behind an OpenAI-compatible ``/v1/completions``."""

from __future__ import annotations

import time

import typer

from workbench.cli import app
from workbench.cli.common import KVMemory, Model, Style, device_option, fail, requires_torch


@app.command(short_help='Serve the mini engine, OpenAI-compatible.')
def serve(
    model: Model = typer.Option("tiny", help="Model preset (random weights)."),
    device: str = device_option(),
    kv: KVMemory = typer.Option("vmm", help="KV memory: vmm (workbench pool pages) or static."),
    style: Style = typer.Option("block", help="KV indexing: block (vLLM) or token (SGLang)."),
    kv_memory: str = typer.Option("1GiB", help="KV pool capacity, e.g. 512MiB, 20G."),
    block_size: int = typer.Option(0, help="Tokens per block (per SGLang page for token style); "
                                     "0 means 16 for block, 1 for token."),
    max_num_seqs: int = typer.Option(64, help="Most sequences in one batch."),
    max_batched_tokens: int = typer.Option(2048, help="Token budget per step."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port (0 picks a free one)."),
    queue_capacity: int = typer.Option(256, min=1, help="Most requests admitted at once "
                                       "(waiting and running); more get 503 with Retry-After."),
    body_timeout: float = typer.Option(10.0, min=0.1, help="Seconds a request body may take "
                                       "to arrive (then 408)."),
    verbose: bool = typer.Option(False, "--verbose", help="Log every HTTP request."),
) -> None:
    """Serve the mini engine over HTTP: OpenAI's /v1/completions (SSE streaming), /v1/models,
    /health, /version and /metrics.

    Prompts are strings (one token per UTF-8 byte) or lists of token ids; see docs/server.md.
    Needs torch.
    """
    requires_torch("serve")
    from workbench.errors import ConfigError
    from workbench.mini.server import ServerConfig, shutdown_server, start_server

    try:
        engine, device = _engine(model.value, device, kv.value, style.value, kv_memory,
                                 block_size, max_num_seqs, max_batched_tokens)
        srv = start_server(engine, host, port, config=ServerConfig(
            queue_capacity=queue_capacity, body_timeout_s=body_timeout, verbose=verbose))
    except ConfigError as err:
        if "engine" in locals():
            engine.close()
        raise fail(err) from None
    g = engine.kv.geometry
    typer.echo(f"serving {engine.model_cfg.name} on {device} ({kv.value} KV, {style.value} "
               f"style, {g.num_blocks} blocks of {g.block_size} tokens) at "
               f"{srv.url}/v1/completions (metrics at {srv.url}/metrics)")
    try:
        while srv.loop.is_alive() and srv.thread.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        shutdown_server(srv)
        engine.close()


def _engine(model: str, device: str, kv: str, style: str, kv_memory: str, block_size: int,
            max_num_seqs: int, max_batched_tokens: int):
    """The engine ``serve`` runs, and the device it chose; ConfigError on a bad option."""
    import torch

    from workbench.config import parse_size
    from workbench.mini.engine import Engine, EngineConfig
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = KVSpec(style=style, backend=kv, kv_bytes=parse_size(kv_memory),
                  block_size=block_size or (16 if style == "block" else 1))
    engine = Engine(get_config(model), spec, device,
                    EngineConfig(max_num_seqs, max_batched_tokens))
    return engine, device
