"""``workbench serve``: the mini engine behind an OpenAI-compatible ``/v1/completions``."""

from __future__ import annotations

import re
import time

import typer

from workbench.cli.common import choice_option, device_option, fail, model_names, requires_torch
from workbench.cli.root import app
from workbench.errors import ConfigError
from workbench.owned import ended_by_signals
from workbench.ranges import Num


@app.command(short_help='Serve the mini engine, OpenAI-compatible.')
def serve(
    model: str = choice_option("tiny", model_names(), "--model", "Model preset (random weights)."),
    device: str = device_option(),
    kv: str = choice_option("vmm", ("vmm", "static"), "--kv",
                            "KV memory: vmm (workbench pool pages) or static."),
    style: str = choice_option("block", ("block", "token"), "--style",
                               "KV indexing: block (vLLM) or token (SGLang)."),
    kv_memory: str = typer.Option("1GiB", "--kv-cache-memory-bytes", "--kv-memory",
                                  help="KV pool capacity, e.g. 512MiB, 20G (vLLM's name; "
                                       "--kv-memory too)."),
    block_size: int = typer.Option(0, parser=Num(int, 0, 4096).parser("--block-size"),
                                   help="Tokens per block (per SGLang page for token style); "
                                   "0 means 16 for block, 1 for token."),
    max_num_seqs: int = typer.Option(64, parser=Num(int, 1, 4096).parser("--max-num-seqs"),
                                     help="Most sequences in one batch."),
    max_batched_tokens: int = typer.Option(
        2048, "--max-num-batched-tokens", "--max-batched-tokens",
        parser=Num(int, 1, 1 << 20).parser("--max-num-batched-tokens"),
        help="Token budget per step (vLLM's name; --max-batched-tokens too)."),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="The model's name in the API (default: the preset)."),
    ipc_name: str | None = typer.Option(
        None, "--ipc-name", help="Publish the KV pool's control segment under this name, for "
        "kvctl and kvtop (default: WORKBENCH_KV_IPC_NAME, else none)."),
    prefix_caching: bool = typer.Option(
        False, "--enable-prefix-caching", help="vLLM's prefix cache: full prompt blocks kept "
        "for reuse (POST /reset_prefix_cache drops them)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, parser=Num(int, 0, 65535).parser("--port"),
                             help="Port (0 picks a free one)."),
    queue_capacity: int = typer.Option(256, parser=Num(int, 1, 1 << 16).parser(
        "--queue-capacity"), help="Most requests admitted at once (waiting and running); more "
        "get 503 with Retry-After."),
    body_timeout: float = typer.Option(10.0, parser=Num(float, 0.1, 3600).parser(
        "--body-timeout"), help="Seconds a request body may take to arrive (then 408)."),
    verbose: bool = typer.Option(False, "--verbose", help="Log every HTTP request."),
) -> None:
    """Serve the mini engine over HTTP, as vLLM's server: OpenAI's /v1/completions and
    /v1/chat/completions (SSE streaming), /v1/models, /health, /version, /metrics (vLLM's
    names) and /reset_prefix_cache.

    Prompts are strings (one token per UTF-8 byte) or lists of token ids; see docs/server.md.
    Needs torch.
    """
    requires_torch("serve")
    from workbench.mini.server import ServerConfig, shutdown_server, start_server

    with ended_by_signals():  # SIGTERM/SIGINT: shut down in order, then end by the signal
        engine = None
        try:
            engine, device = _engine(model, device, kv, style, kv_memory, block_size,
                                     max_num_seqs, max_batched_tokens, prefix_caching,
                                     _ipc_name(ipc_name))
            srv = start_server(engine, host, port, model_name=served_model_name,
                               config=ServerConfig(queue_capacity=queue_capacity,
                                                   body_timeout_s=body_timeout,
                                                   verbose=verbose))
        except BaseException as err:
            if engine is not None:
                engine.close()
            if not isinstance(err, ConfigError):
                raise
            raise fail(err) from None
        g, ipc = engine.kv.geometry, engine.kv.spec.ipc_name
        typer.echo(f"serving {served_model_name or engine.model_cfg.name} on {device} ({kv} KV, "
                   f"{style} style, {g.num_blocks} blocks of {g.block_size} tokens) at "
                   f"{srv.url}/v1 (metrics at {srv.url}/metrics"
                   + (f"; pool {ipc}: workbench kvctl limit {ipc} SIZE)" if ipc else ")"))
        try:
            while srv.loop.is_alive() and srv.thread.is_alive():
                time.sleep(0.5)
        finally:
            shutdown_server(srv)
            engine.close()


def _ipc_name(given: str | None) -> str | None:
    """``--ipc-name``, else WORKBENCH_KV_IPC_NAME (read once, with every other setting)."""
    from workbench.config import check_ipc_name
    from workbench.settings import settings

    name = given if given is not None else settings().ipc_name
    if name is None:
        return None
    try:
        return check_ipc_name(name)
    except ConfigError as err:
        raise fail(err) from None


def _engine(model: str, device: str, kv: str, style: str, kv_memory: str, block_size: int,
            max_num_seqs: int, max_batched_tokens: int, prefix_caching: bool = False,
            ipc_name: str | None = None):
    """The engine ``serve`` runs, and the device it chose; ConfigError on a bad option."""
    import torch

    from workbench.mini.engine import Engine, EngineConfig
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config
    from workbench.units import parse_size

    device = _device(device, torch)
    spec = KVSpec(style=style, backend=kv, kv_bytes=parse_size(kv_memory),
                  block_size=block_size or (16 if style == "block" else 1), ipc_name=ipc_name)
    engine = Engine(get_config(model), spec, device,
                    EngineConfig(max_num_seqs, max_batched_tokens,
                                 prefix_caching=prefix_caching))
    return engine, device


def _device(name: str, torch) -> str:
    """The torch device to serve on; a name this host cannot honour is one ConfigError line."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if re.fullmatch(r"cuda(:[0-9]{1,3})?", name):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}", "this host has no usable CUDA device "
                              "(torch.cuda.is_available() is false)", "pass --device cpu or auto")
        index, count = int(name.partition(":")[2] or 0), torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"--device {name}", f"this host has {count} CUDA device(s)",
                              f"pass cuda:0..cuda:{count - 1}")
        return name
    shown = name if name.isprintable() else ascii(name)
    raise ConfigError(f"--device {shown[:40]}", "not a device", "pass auto, cpu, cuda or cuda:N")
