"""vLLM with kvcached 0.1.6 itself as the elastic KV layer: the colocation sweep's third mode
beside the stock static split and the workbench's elastic pool
(docs/sources.md#upstream-kvcached-setting).

The engine is a stock :class:`~workbench.engines.real.vllm.VllmEngine` (no ``WORKBENCH_KV_*`` in
its environment, so the workbench's autopatch stays off) started by an interpreter that sees
kvcached (``gpu/kvcached/env.sh`` installs it and names that interpreter in
:data:`PYTHON_VAR`), with kvcached's switches set: its ``.pth`` then patches vLLM's V1 runner when
vLLM is imported. Each engine gets its own IPC name, so its ``/dev/shm`` segment (three int64:
limit, used and preallocated bytes) and its worker-socket folder are its own; :func:`read_segment`
reads the segment for the record (sampled like the elastic pools' mapped bytes),
:func:`patch_report` which of kvcached's patches its log says applied, :func:`map_costs`
kvcached's own per-page map and unmap times from its log, and :class:`Ballast` trims the device
so kvcached's headroom rule leaves the sweep's budget and no more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from workbench.engines.metrics import MemorySample
from workbench.engines.real.vllm import VllmEngine, VllmSpec, block_bytes, device_free_bytes
from workbench.errors import ConfigError
from workbench.settings import ENV_PREFIX

VERSION = "0.1.6"
PYTHON_VAR = "WORKBENCH_KVCACHED_PYTHON"  # an interpreter that sees kvcached (env.sh sets it)
SHM_DIR = Path("/dev/shm")
SOCKET_ROOT = Path("/tmp")  # kvcached's worker sockets: /tmp/kvcached-tp-<name>-<hash>/
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_GROW = re.compile(r"prealloc cost: (\d+) us, prealloc (\d+) pages")
_SHRINK = re.compile(r"Unmapped (\d+) pages from KV tensors, cost: (\d+) us")
_PATCHED = re.compile(r"(Successfully patched|Failed to patch) vllm: (.*)$", re.M)
# the patches vLLM 0.26's V1 runner needs from kvcached: without one it runs partly stock
ESSENTIAL = ("elastic_block_pool", "engine_core", "kv_cache_coordinator", "gpu_model_runner",
             "gpu_worker", "allocate_slots")


@dataclass(frozen=True, slots=True)
class KvcachedSetting:
    """kvcached's knobs, defaulting to its colocation benchmark's ``bench-config.yaml``."""

    gpu_utilization: float = 0.95  # maps only while free memory stays above (1 - this) * total
    min_reserved_pages: int = 5  # pages the prealloc thread keeps mapped ahead
    max_reserved_pages: int = 10  # freed pages kept mapped instead of unmapped
    page_prealloc: bool = True
    log_level: str = "INFO"  # INFO: its prealloc and unmap lines carry their cost
    contiguous_layout: bool | None = None  # None: kvcached's default (contiguous on CUDA)

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_utilization <= 1.0:
            raise ConfigError(f"kvcached gpu_utilization {self.gpu_utilization}",
                              "is the share of the device kvcached may fill", "give 0 < u <= 1")
        if not 0 <= self.min_reserved_pages <= self.max_reserved_pages:
            raise ConfigError(f"kvcached reserved pages {self.min_reserved_pages}.."
                              f"{self.max_reserved_pages}", "min must not exceed max",
                              "give 0 <= min_reserved_pages <= max_reserved_pages")

    def env(self, ipc_name: str) -> dict[str, str]:
        """The server's environment for kvcached: its switches, its knobs, one IPC name, and
        vLLM's V1 runner (kvcached 0.1.6 refuses Model Runner V2 before vLLM 0.28)."""
        check_name(ipc_name)
        env = {"ENABLE_KVCACHED": "true", "KVCACHED_AUTOPATCH": "1",
               "KVCACHED_IPC_NAME": ipc_name,
               "KVCACHED_GPU_UTILIZATION": repr(self.gpu_utilization),
               "KVCACHED_MIN_RESERVED_PAGES": str(self.min_reserved_pages),
               "KVCACHED_MAX_RESERVED_PAGES": str(self.max_reserved_pages),
               "KVCACHED_PAGE_PREALLOC_ENABLED": "true" if self.page_prealloc else "false",
               "KVCACHED_LOG_LEVEL": self.log_level, "VLLM_USE_V2_MODEL_RUNNER": "0"}
        if self.contiguous_layout is not None:
            env["KVCACHED_CONTIGUOUS_LAYOUT"] = "true" if self.contiguous_layout else "false"
        return env


def check_name(ipc_name: str) -> str:
    """``ipc_name`` when kvcached would take it as given (it rewrites other characters, and
    the segment could then not be found under the name we asked for)."""
    if not _NAME.fullmatch(ipc_name):
        raise ConfigError(f"kvcached IPC name {ipc_name!r}", "kvcached keeps only 1-64 of "
                          "A-Z a-z 0-9 _ -", "use a name of those characters")
    return ipc_name


def socket_dir(ipc_name: str) -> Path:
    """The worker-socket folder kvcached makes for ``ipc_name``: the name and a short hash of
    it (uuid5 in the DNS namespace, 8 hex digits), so every process of one instance agrees."""
    digest = uuid.uuid5(uuid.NAMESPACE_DNS, ipc_name).hex[:8]
    return SOCKET_ROOT / f"kvcached-tp-{ipc_name}-{digest}"


def ipc_name_for(name: str) -> str:
    """The IPC name of engine ``name`` started by this process: its own segment and sockets."""
    return check_name(f"kvc_{name}_{os.getpid()}"[:64])


def kvcached_python() -> str:
    """The interpreter that sees kvcached, or a one-line refusal naming how to get one."""
    chosen = os.environ.get(PYTHON_VAR)
    if not chosen or not Path(chosen).exists():
        raise ConfigError("the kvcached mode", f"needs an interpreter that sees kvcached "
                          f"{VERSION} ({PYTHON_VAR} unset or missing)",
                          "on the GPU machine source gpu/kvcached/env.sh after gpu/vllm26/env.sh")
    return chosen


@dataclass(frozen=True, slots=True)
class Segment:
    """kvcached's ``/dev/shm`` segment: the limit and the bytes in use and mapped ahead, summed
    over layers and K/V."""

    limit: int
    used: int
    prealloc: int

    @property
    def mapped(self) -> int:
        return self.used + self.prealloc


def read_segment(ipc_name: str, shm_dir: Path | None = None) -> Segment | None:
    """The segment of ``ipc_name`` under a shared lock (kvcached writes it under an exclusive
    one); None when there is none (not started yet, or shut down: 0.1.6 removes it)."""
    try:
        with open((shm_dir or SHM_DIR) / check_name(ipc_name), "rb") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            raw = f.read(24)
    except FileNotFoundError:
        return None
    if len(raw) != 24:
        return None
    return Segment(*struct.unpack("=qqq", raw))


def map_costs(log: str) -> dict[str, list[float]]:
    """kvcached's own timings from its log at INFO, in microseconds per page: ``grow`` from each
    batch its prealloc thread mapped ahead (the free-memory check, the maps and the locks; a map
    on the allocating thread itself logs only at DEBUG), ``shrink`` from each batch unmapped."""
    grow = [int(us) / int(n) for us, n in _GROW.findall(log) if int(n)]
    shrink = [int(us) / int(n) for n, us in _SHRINK.findall(log) if int(n)]
    return {"grow": grow, "shrink": shrink}


def patch_report(log: str) -> dict[str, list[str]]:
    """Which of kvcached's vLLM patches its log says applied, which failed, and which of
    :data:`ESSENTIAL` it never applied (kvcached logs a failed patch and runs on partly stock:
    a point with any missing is not a kvcached point)."""
    applied: set[str] = set()
    failed: set[str] = set()
    for verdict, names in _PATCHED.findall(log):
        (applied if verdict.startswith("Success") else failed).update(
            n.strip() for n in names.split(",") if n.strip())
    return {"applied": sorted(applied), "failed": sorted(failed - applied),
            "missing": [n for n in ESSENTIAL if n not in applied]}


def ballast_bytes(free: int, total: int, budget: int, mapped: int,
                  utilization: float = 0.95) -> int:
    """Bytes to hold so kvcached's engines can map ``budget`` in all and no more: kvcached maps
    while ``free - (1 - utilization) * total`` stays positive, and ``mapped`` of the budget is
    already mapped. Negative: the device cannot give them ``budget``."""
    return free - int(total * (1 - utilization)) - (budget - mapped)


@dataclass(slots=True)
class Ballast:
    """Device memory this process holds so that kvcached sees the sweep's budget and no more
    (an H200 has far more room than kvcached's A100 left)."""

    held: list = field(default_factory=list)

    def hold(self, nbytes: int) -> int:
        """Allocate ``nbytes`` (rounded down to 2 MiB) on the current CUDA device; the bytes
        held. Nothing for ``nbytes <= 0``."""
        import torch

        n = max(0, nbytes) // (2 << 20) * (2 << 20)
        if n:
            self.held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        return n

    def release(self) -> None:
        self.held.clear()
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()


def cap_at_budget(engines: list, budget: int, ballast: Ballast, mem_info=None,
                  setting: KvcachedSetting | None = None) -> dict:
    """Once ``engines`` are up: hold what the device has beyond ``budget`` (less what they mapped
    ahead at start-up), so kvcached's headroom rule leaves them the budget and no more; what the
    record keeps of it. ``wanted`` < 0: the device cannot give them the budget, by that much."""
    if mem_info is None:
        import torch

        mem_info = torch.cuda.mem_get_info
    free, total = mem_info()
    mapped = sum((e.segment() or Segment(0, 0, 0)).mapped for e in engines)
    u = (setting or KvcachedSetting()).gpu_utilization
    want = ballast_bytes(free, total, budget, mapped, u)
    held = ballast.hold(want)
    return {"free_before": free, "total": total, "mapped_at_start": mapped, "wanted": want,
            "held": held, "free_after": mem_info()[0],
            "kvcached_may_map": budget + min(0, want)}


class KvcachedVllmEngine(VllmEngine):
    """One real vLLM whose KV cache kvcached maps on demand (its ``.pth`` autopatch)."""

    title = f"real vLLM with kvcached {VERSION}"
    server_text = f"real vLLM through its OpenAI server, kvcached {VERSION} as the KV layer"
    server_short = f"real vLLM + kvcached {VERSION}"

    def __init__(self, name: str, spec: VllmSpec, **kw):
        if spec.elastic or spec.env.get("ENABLE_KVCACHED") != "true":
            raise ConfigError(f"kvcached engine {name!r}", "needs kvcached's switches and not "
                              "the workbench's elastic pool", "start it with kvcached.engine()")
        super().__init__(name, spec, **kw)
        self.kvcached_ipc = spec.env["KVCACHED_IPC_NAME"]
        self.reaper.folders.append(socket_dir(self.kvcached_ipc))

    def segment(self) -> Segment | None:
        return read_segment(self.kvcached_ipc)

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def map_costs(self) -> dict[str, list[float]]:
        return map_costs(self._log_text())

    def facts(self) -> dict:
        """What the record keeps of this engine after start-up: kvcached's version, its IPC
        name, its segment and which of its patches applied."""
        seg = self.segment()
        return {"kvcached": VERSION, "ipc": self.kvcached_ipc,
                "limit": seg.limit if seg else None, "mapped_idle": seg.mapped if seg else None,
                "patches": patch_report(self._log_text())}

    def _block_bytes(self) -> int:
        try:
            return block_bytes(self.spec.model, self.spec.block_size or 16)
        except (OSError, KeyError, ValueError):
            return 0

    def _sample_loop(self) -> None:
        """The device's free memory and kvcached's mapped bytes (used + preallocated), as the
        elastic engines' samples, so a point's peak mapped reads the same for every mode."""
        per_block = self._block_bytes()
        while not self._stop.is_set():
            t = self.clock()
            with contextlib.suppress(Exception):
                self.free_samples.append((t, device_free_bytes(self.spec.device)))
            with contextlib.suppress(Exception):
                seg = self.segment()
                if seg is not None:
                    used = seg.used // per_block if per_block else 0
                    self.samples.append(MemorySample(t, self.name, seg.mapped, seg.prealloc,
                                                     used))
            self._stop.wait(self.sample_every_s)

    def close(self) -> None:
        super().close()
        with contextlib.suppress(OSError):  # left behind only when the server was killed
            (SHM_DIR / self.kvcached_ipc).unlink()


def engine(name: str, model: str, root: Path, *, setting: KvcachedSetting | None = None,
           device: str = "cuda", python: str | None = None, **spec_kw) -> KvcachedVllmEngine:
    """A kvcached engine for a lab's runner: the spec fields the static and elastic engines get
    (``kv_cache_bytes``, ``num_gpu_blocks`` of the whole budget: kvcached backs them on demand),
    kvcached's interpreter and ``setting``'s environment. Never the workbench's code in its
    process: ``WORKBENCH_KV_*`` in ``env`` (the step recorder's knob too) is dropped."""
    env = {k: v for k, v in spec_kw.pop("env", {}).items() if not k.startswith(ENV_PREFIX)}
    env.update((setting or KvcachedSetting()).env(ipc_name_for(name)))
    return KvcachedVllmEngine.for_lab(name, device, model, python or kvcached_python(), root,
                                      elastic=False, env=env, **spec_kw)
