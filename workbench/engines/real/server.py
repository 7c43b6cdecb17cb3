"""What every server engine kind shares (:class:`ServerEngine`): one engine server per instance
in a process of its own, elastic (autopatch + ``WORKBENCH_KV_*``) or stock -- its launch, health
check, streaming client, memory sampler, log, and clean-up.

The pool lives in the engine's process, so :attr:`ServerEngine.kv_pool` is a read-only view of
its control segment (what ``kvtop`` reads); the memory timeline samples that segment and the
device's free memory. Every process, segment and socket folder the instance made is gone after
:meth:`close` -- also on failure, interpreter exit, SIGTERM and SIGINT (:mod:`.procs`).

A kind (:mod:`.vllm`, :mod:`.sglang`) names only what differs: its spec, interpreter, server
command, environment, client, model folder, counters and block geometry.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.real.client import Outcome, Sampling, Sender
from workbench.engines.real.procs import Reaper, install_handlers
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError
from workbench.outfiles import write_all
from workbench.settings import ENV_PREFIX

REPO = Path(__file__).resolve().parents[3]
STAND_INS: dict[str, list[str]] = {}  # kind name -> a stand-in server's command (tests)
LOGS: list[Path] = []  # where engine logs are kept; else WORKBENCH_VLLM_LOGS when set


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_free_bytes(device: str) -> int:
    """Free memory of the engines' device: the GPU's (CUDA), else the host's MemAvailable."""
    if device != "cpu":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def block_bytes(model: str, block_size: int, dtype_bytes: int = 2) -> int:
    """The KV bytes of one block over every layer (K and V) of the model in folder ``model``:
    what a page id's bytes divide by to give blocks per page."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return (2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * block_size
            * dtype_bytes)


class SegmentPool:
    """A read-only view of an out-of-process pool, through its control segment."""

    def __init__(self, ipc_name: str):
        self.name = ipc_name

    def info(self):
        """The segment's state; None for a stock engine (no segment) or one not published."""
        from workbench.core import control

        return control.read_segment(self.name) if self.name else None

    def _get(self, attr: str) -> int:
        i = self.info()
        return int(getattr(i, attr)) if i is not None else 0

    @property
    def capacity_bytes(self) -> int:
        return self._get("capacity")

    @property
    def mapped_bytes(self) -> int:
        return self._get("mapped")

    @property
    def used_blocks(self) -> int:
        return self._get("used_blocks")

    @property
    def limit_bytes(self) -> int:
        return self._get("limit")


class ServerEngine:
    """One real engine server behind the :class:`~workbench.engines.base.Engine` protocol.
    Subclasses set the class attributes and the interpreter and command of their server."""

    kind: ClassVar[str]  # the engine kind's name (workbench.engines.kinds)
    spec_type: ClassVar[type]  # the kind's spec dataclass (model, device, elastic, knobs, ...)
    sender_type: ClassVar[type[Sender]] = Sender  # the client that streams this kind's requests
    label: ClassVar[str]  # "vLLM server" in messages
    # the spec fields the labs' runners share, under vLLM's names, renamed for this kind
    renames: ClassVar[dict[str, str]] = {}
    lab_knobs: ClassVar[dict[str, str]] = {}  # WORKBENCH_KV_* the labs start this kind with
    lab_pool: ClassVar[dict[str, Any]] = {}  # the labs' pool (spec fields), where it sizes one
    flushes_cache: ClassVar[bool] = False  # drops its prefix cache on request (flush_cache)
    # model runner (a lab's runner= parameter) -> the server environment that picks it
    runners: ClassVar[dict[str, dict[str, str]]] = {}
    runner: str | None = None  # the model runner this server ran (read once it is ready)
    # what the labs' reports say of a run on this kind: its title, the server, the model
    title: ClassVar[str]
    server_text: ClassVar[str]
    server_short: ClassVar[str]  # the same beside another kind
    model_text: ClassVar[str]

    def __init__(self, name: str, spec: Any, *, sampling: Sampling | None = None,
                 sample_every_s: float = 0.05, workdir: str | Path | None = None,
                 keep_log: str | Path | None = None):
        self.name, self.spec = name, spec
        self.sampling = sampling or Sampling()
        self.ipc_name = f"{name}-{os.getpid()}" if spec.elastic else ""
        self.reaper = Reaper()
        install_handlers()
        self.dir = Path(tempfile.mkdtemp(prefix=f"wb-{self.kind}-{name}-", dir=workdir))
        self.reaper.folders.append(self.dir)
        self.log = self.dir / "server.log"
        self.keep_log = Path(keep_log) if keep_log else None  # a folder the log is copied to
        self.port = free_port()
        self.requests: list[Request] = []
        self.samples: list[MemorySample] = []
        self.free_samples: list[tuple[float, int]] = []
        self.t0 = time.monotonic()
        self._sender: Sender | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.sample_every_s = sample_every_s
        self.process: subprocess.Popen | None = None

    # -- the kind: its interpreter and how the labs start it -----------------------------
    @classmethod
    def build_facts(cls, device: str, runner: str | None = None) -> dict[str, str]:
        """What a record says of this kind's build on ``device`` (its kernels; ``runner``: the
        model runner the run asked for and its engines ran); nothing by default."""
        return {}

    @classmethod
    def runner_env(cls, runner: str) -> dict[str, str]:
        """The environment that starts this kind's server on model runner ``runner``, or a
        one-line refusal for a runner it does not have."""
        env = cls.runners.get(runner)
        if env is None:
            has = f"the runners {', '.join(cls.runners)}" if cls.runners else "one model runner"
            raise ConfigError(f"runner={runner} for the {cls.label}", f"it has {has}",
                              "leave runner unset" if not cls.runners
                              else f"use runner={' or '.join(cls.runners)}")
        return dict(env)

    @classmethod
    def asked_runner(cls, env: Mapping[str, str]) -> str | None:
        """The model runner ``env`` picks (None: none of :attr:`runners`' settings)."""
        return next((r for r, e in cls.runners.items() if e.items() <= env.items()), None)

    @classmethod
    def why_missing(cls) -> str | None:
        """None when this kind's engine can run here, else why not and how to get it."""
        raise NotImplementedError

    @classmethod
    def interpreter(cls, what: str) -> str:
        """The interpreter with this kind's engine, or a one-line refusal naming ``what``."""
        raise NotImplementedError

    @classmethod
    def missing(cls) -> str | None:
        """:meth:`why_missing`, but a stand-in server (tests) needs nothing."""
        return None if STAND_INS.get(cls.kind) else cls.why_missing()

    @classmethod
    def require(cls, what: str) -> str:
        """The interpreter that runs this kind's server (a stand-in's own: this one)."""
        return sys.executable if STAND_INS.get(cls.kind) else cls.interpreter(what)

    @classmethod
    def model_dir(cls, python: str, root: Path) -> str:
        """The tiny random Llama this kind serves in the labs (built once per run)."""
        raise NotImplementedError

    @classmethod
    def for_lab(cls, name: str, device: str, model: str, python: str, root: Path, *,
                elastic: bool, **kw: Any) -> ServerEngine:
        """One engine for a lab's runner. ``kw`` are spec fields under the runners' shared
        names (renamed for this kind); the kind's lab knobs are added."""
        logs = LOGS[0] if LOGS else os.environ.get("WORKBENCH_VLLM_LOGS") or None
        stand_in = STAND_INS.get(cls.kind)
        if stand_in:
            kw.setdefault("server_cmd", stand_in)
        runner = kw.pop("runner", None)
        if runner is not None:
            kw["env"] = {**kw.get("env", {}), **cls.runner_env(runner)}
        kw = {cls.renames.get(k, k): v for k, v in kw.items()}
        knobs = kw.setdefault("knobs", {})
        for k, v in cls.lab_knobs.items():
            knobs.setdefault(k, v)
        spec = cls.spec_type(model=model, device=device, elastic=elastic, python=python, **kw)
        return cls(name, spec, workdir=root, keep_log=logs)

    # -- life cycle ----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
        if self.spec.elastic:
            sockets = self.dir / "sockets"  # the adapters create it (private, mode 0700)
            env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=self.ipc_name,
                       WORKBENCH_KV_SOCKET_DIR=str(sockets))
            env.update({f"WORKBENCH_KV_{k.upper()}": str(v) for k, v in self.spec.knobs.items()})
        self.kind_env(env)
        env.update(self.spec.env)
        return env

    def kind_env(self, env: dict[str, str]) -> None:
        """What this kind's server needs in its environment besides (edited in place)."""

    def launch(self) -> ServerEngine:
        """Start the server process. From the thread that will outlive it: the process gets
        SIGTERM when the thread that started it ends (its parent-death signal)."""
        try:
            if self.spec.elastic:
                self.reaper.segments.append(self.ipc_name)
            cmd = self.spec.server_cmd or self.server_command()
            self.process = self.reaper.spawn(cmd + self.spec.args(self.port, self.name),
                                             self.env(), self.log)
            return self
        except BaseException:
            self.close()
            raise

    def server_command(self) -> list[str]:
        """The server's command line before its arguments (the kind's engine)."""
        raise NotImplementedError

    def ready(self) -> ServerEngine:
        """Wait for the launched server's health check; then the clock and sampler start."""
        try:
            self._wait_healthy()
            self.t0 = time.monotonic()
            self._sender = self.sender_type(self.url, self.name, self.sampling, self.clock)
            self._sampler = threading.Thread(target=self._sample_loop, daemon=True)
            self._sampler.start()
            return self
        except BaseException:
            self.close()
            raise

    def start(self) -> ServerEngine:
        return self.launch().ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self) -> None:
        import httpx

        end = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} {self.name!r} exited with "
                                   f"{self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{self.label} {self.name!r} not healthy after "
                           f"{self.spec.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        """The server log's error lines (the root cause sits far above the last traceback of a
        failed start) and its end."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        errs = [ln for ln in text.splitlines() if "Error" in ln or "error:" in ln]
        return "\n".join(dict.fromkeys(errs[-12:])) + "\n...\n" + text[-n:]

    def close(self) -> None:
        self._stop.set()
        if self._sampler is not None:  # a daemon thread inside a CUDA call aborts the exit
            self._sampler.join(5.0)
        if self.keep_log is not None and self.log.exists():
            with contextlib.suppress(OSError, ConfigError):  # a log kept is a courtesy
                write_all([(self.keep_log / f"{self.name}.log", self.log.read_bytes())],
                          "log folder")
        if self._sender is not None:
            self._sender.close()
        self.reaper.close()

    def __enter__(self) -> ServerEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the Engine protocol -------------------------------------------------------------
    def clock(self) -> float:
        return time.monotonic() - self.t0

    def submit(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.requests.append(r)
            self._sender.send(r)

    def advance(self, until: float | None = None) -> None:
        self._sender.wait(until)

    def has_work(self) -> bool:
        return self._sender is not None and self._sender.busy()

    def metrics(self, slo: SLO | None = None) -> Summary:
        return summarize(self.requests, slo)

    def memory_timeline(self) -> list[MemorySample]:
        return list(self.samples)

    @property
    def kv_pool(self) -> SegmentPool:
        return SegmentPool(self.ipc_name)

    # -- what the labs read besides ------------------------------------------------------
    def outcome(self, rid: int) -> Outcome:
        return self._sender.outcomes[rid]

    def counters(self) -> dict[str, float]:
        """The engine's own counters the labs read (preemptions, prefix-cache queries and
        hits, running, waiting); {} for a kind that publishes none."""
        return {}

    def blocks_per_page(self, page_id_bytes: int) -> tuple[int, int]:
        """(one ledger block in tokens, ledger blocks per page id) for a started engine."""
        raise NotImplementedError

    def _sample_loop(self) -> None:
        from workbench.core import control

        while not self._stop.is_set():
            t = self.clock()
            with contextlib.suppress(Exception):
                self.free_samples.append((t, device_free_bytes(self.spec.device)))
            if self.ipc_name:
                with contextlib.suppress(Exception):
                    i = control.read_segment(self.ipc_name)
                    if i is not None:
                        self.samples.append(MemorySample(t, self.name, i.mapped, i.reserved,
                                                         i.used_blocks))
            self._stop.wait(self.sample_every_s)
