"""The ``sglang`` engine kind: one real SGLang server per instance (``sglang.launch_server`` in a
process of its own), elastic (autopatch + ``WORKBENCH_KV_*``) or stock.

It shares every server kind's life cycle (:class:`~workbench.engines.real.server.ServerEngine`:
process group, control segment view, memory sampler, clean-up on close and signals) and differs
in what it starts and how it talks: SGLang's native ``/generate`` with ``input_ids`` (the server
runs without a tokenizer), streamed, every chunk timed on arrival. SGLang runs on CUDA only here:
Triton attention, the pytorch sampler, random weights (``--load-format dummy``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.engines.real.client import Outcome, Sampling, Sender
from workbench.engines.real.server import REPO, ServerEngine, block_bytes
from workbench.engines.sched.request import Request
from workbench.errors import ConfigError
from workbench.outfiles import check, write_text

HOST_VENVS = [REPO / ".venvs" / v / "bin" / "python" for v in ("sglang0516", "sglang")]
HOW_TO_GET = ("on an H200 use the gpu/sglang0516 recipe (SGLang 0.5.16 for torch 2.11); "
              "`make engine-sglang0516` builds a CPU venv (its classes, no server)")


def _has_sglang(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("sglang") is not None
    probe = "import importlib.util,sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def sglang_python() -> str | None:
    """``WORKBENCH_SGLANG_PYTHON`` when set, else this interpreter, else a host venv."""
    chosen = os.environ.get("WORKBENCH_SGLANG_PYTHON")
    if chosen:
        return chosen if _has_sglang(chosen) else None
    if _has_sglang(sys.executable):
        return sys.executable
    return next((str(p) for p in HOST_VENVS if p.exists() and _has_sglang(str(p))), None)


def require_sglang(what: str) -> str:
    """The interpreter with SGLang, or a one-line refusal naming ``what`` needed it."""
    py = sglang_python()
    if py is None:
        raise ConfigError(what, "needs a real SGLang and none is importable here", HOW_TO_GET)
    return py


def sglang_missing() -> str | None:
    """None when a real SGLang server can be started here, else the one-line reason."""
    return None if sglang_python() else f"no SGLang importable here; {HOW_TO_GET}"


@dataclass(slots=True)
class SglangSpec:
    """How to start one SGLang server. ``server_cmd`` replaces SGLang's (a test stand-in)."""

    model: str
    device: str = "cuda"
    elastic: bool = True
    knobs: dict[str, str] = field(default_factory=dict)  # WORKBENCH_KV_<key> for elastic runs
    mem_fraction_static: float = 0.3
    max_total_tokens: int | None = None  # SGLang's pool size in tokens (None: from memory)
    max_running_requests: int = 64
    context_length: int = 4096
    page_size: int = 1
    radix_cache: bool = True
    deterministic: bool = True  # batch-invariant kernels: which requests share a step moves no sum
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # set last in the server's environment
    python: str | None = None
    server_cmd: list[str] | None = None
    startup_timeout_s: float = 600.0

    def args(self, port: int, served: str) -> list[str]:
        a = ["--model-path", self.model, "--served-model-name", served, "--host", "127.0.0.1",
             "--port", str(port), "--load-format", "dummy", "--dtype", "bfloat16",
             "--random-seed", "0", "--attention-backend", "triton", "--sampling-backend",
             "pytorch", "--grammar-backend", "none", "--skip-tokenizer-init",
             "--disable-cuda-graph", "--skip-server-warmup", "--page-size", str(self.page_size),
             "--mem-fraction-static", str(self.mem_fraction_static), "--context-length",
             str(self.context_length), "--max-running-requests", str(self.max_running_requests)]
        if self.max_total_tokens:
            a += ["--max-total-tokens", str(self.max_total_tokens)]
        if not self.radix_cache:
            a.append("--disable-radix-cache")
        if self.deterministic:
            a.append("--enable-deterministic-inference")
        return a + list(self.extra_args)


def body(req: Request, sampling: Sampling) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": req.max_new_tokens,
                              "temperature": sampling.temperature,
                              "ignore_eos": sampling.ignore_eos}
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed + req.rid
    return {"input_ids": list(req.prompt), "sampling_params": params, "stream": True}


def new_ids(msg: dict, seen: int) -> list[int]:
    """The tokens a chunk adds. SGLang streams ``output_ids`` whole (its default) or as
    increments (a server setting); ``meta_info.completion_tokens`` counts them all. A whole list
    is at least that long -- it may already hold a token or two more, since SGLang serializes
    its live list after counting -- so its new tokens are those past ``seen``; a shorter list
    is an increment, new as it stands."""
    ids = [int(t) for t in msg.get("output_ids") or []]
    total = (msg.get("meta_info") or {}).get("completion_tokens")
    if total is None or len(ids) >= int(total):
        return ids[seen:]
    return ids


def on_chunk(msg: dict, req: Request, now: float, out: Outcome) -> None:
    """One streamed ``/generate`` message: its new token ids and SGLang's cached-token count."""
    ids = new_ids(msg, len(out.token_ids))
    cached = (msg.get("meta_info") or {}).get("cached_tokens")
    if cached is not None:
        out.cached_tokens = int(cached)
    if ids:
        if req.first_token is None:
            req.first_token = now
        out.token_ids.extend(ids)
        req.token_times.extend([now] * len(ids))
        req.tokens.extend(ids)


class SglangSender(Sender):
    on_chunk = staticmethod(on_chunk)  # SGLang's /generate, token ids in and out

    def payload(self, req: Request) -> dict[str, Any]:
        return body(req, self.sampling)

    def __init__(self, base_url: str, model: str, sampling: Sampling, clock):
        super().__init__(base_url, model, sampling, clock)
        self.url = base_url.rstrip("/") + "/generate"


class SglangEngine(ServerEngine):
    """One real SGLang server behind the :class:`~workbench.engines.base.Engine` protocol."""

    kind = "sglang"
    spec_type = SglangSpec
    sender_type = SglangSender
    label = "SGLang server"
    renames = {"max_num_seqs": "max_running_requests", "prefix_caching": "radix_cache"}
    lab_knobs = {"gpu_utilization": "0.45"}  # what the H200 run used beside stock
    lab_pool = {"max_total_tokens": 32768}  # SGLang sizes its pool from memory: 512 MiB of slots
    flushes_cache = True
    title = "real SGLang"
    server_text = "real SGLang through its native /generate (token ids)"
    server_short = "real SGLang (/generate, token ids)"
    model_text = "tiny-llama (4 layers, random weights from config.json)"

    @classmethod
    def why_missing(cls) -> str | None:
        return sglang_missing()

    @classmethod
    def interpreter(cls, what: str) -> str:
        return require_sglang(what)

    @classmethod
    def model_dir(cls, python: str, root: Path) -> str:
        """The tiny Llama's ``config.json`` alone (random weights, ``--load-format dummy``; no
        tokenizer, the server takes token ids)."""
        return str(tiny_llama_config(root / "tiny-llama-sglang"))

    def kind_env(self, env: dict[str, str]) -> None:
        for k in [k for k in env if k.startswith("VLLM_")]:
            del env[k]
        env.update(SGLANG_IS_FLASHINFER_AVAILABLE="false", SGLANG_ENABLE_JIT_DEEPGEMM="0")

    def launch(self) -> SglangEngine:
        if self.spec.device == "cpu":
            self.close()
            raise ConfigError(f"engine {self.name!r} on the CPU",
                              "the sglang kind runs SGLang's CUDA server only",
                              "run it on a GPU (--backend gpu), or use the vllm kind here")
        return ServerEngine.launch(self)

    def server_command(self) -> list[str]:
        python = self.spec.python or require_sglang(f"engine {self.name!r}")
        return [python, "-m", "sglang.launch_server"]

    def blocks_per_page(self, page_id_bytes: int) -> tuple[int, int]:
        """(SGLang's page size in token slots, its pages per page id): a ledger block is one
        SGLang page."""
        size = self.spec.page_size
        return size, page_id_bytes // block_bytes(self.spec.model, size)

    def flush_cache(self) -> dict[str, Any]:
        """``POST /flush_cache``: SGLang drops its radix cache, so the cached tokens' slots go
        back to the allocator (and their pages unmap). SGLang refuses it while requests run;
        the answer says which (``ok``, the HTTP status, SGLang's text)."""
        import httpx

        try:
            r = httpx.post(self.url + "/flush_cache", timeout=30)
            if r.status_code == 405:  # a release that routes the verb as GET only
                r = httpx.get(self.url + "/flush_cache", timeout=30)
        except httpx.HTTPError as err:
            return {"ok": False, "status": None, "text": f"{type(err).__name__}: {err}"[:200]}
        return {"ok": r.status_code == 200, "status": r.status_code, "text": r.text[:200]}


def tiny_llama_config(path: str | Path, *, hidden: int = 1024, heads: int = 8,
                      kv_heads: int = 8, head_dim: int = 128, layers: int = 4,
                      vocab: int = 4096) -> Path:
    """A Llama-shaped ``config.json`` alone: SGLang makes random weights for it
    (``--load-format dummy``) and needs no tokenizer (``--skip-tokenizer-init``)."""
    path = check(Path(path) / "config.json", "model folder").parent  # before any folder is made
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim,
           "intermediate_size": 2 * hidden, "vocab_size": vocab, "hidden_act": "silu",
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    write_text(path / "config.json", json.dumps(cfg, indent=1), "model folder")
    return path
