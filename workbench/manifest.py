"""The version manifest of seed 000 §2, collected in one place: ``workbench doctor`` prints it and
every lab record (:class:`workbench.labs.record.Manifest`) carries its software part.

Nothing here raises: a fact that cannot be read (no git, no torch, a broken driver) is ``None`` or
says so, because a manifest reports what it finds.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# Distributions whose versions every lab record carries.
RECORD_DISTS = ("simpy", "numpy", "torch", "vllm", "sglang", "kvcached")


def package_root() -> Path:
    """The folder holding the ``workbench`` package (the checkout's root in development)."""
    return Path(__file__).resolve().parents[1]


def git_commit(root: Path | None = None) -> str | None:
    """HEAD of the checkout the workbench runs from, or None (no git, not a checkout)."""
    root = root or package_root()
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def mem_total() -> int | None:
    from workbench.procs import memory_total

    return memory_total()


def host_hardware() -> dict[str, Any]:
    return {"machine": platform.machine(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "memory": mem_total()}


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"installed": False}
    out = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
           "hip": getattr(torch.version, "hip", None), "cuda_available": False, "gpus": []}
    try:
        if torch.cuda.is_available():
            out["cuda_available"] = True
            out["gpus"] = [{"name": torch.cuda.get_device_name(i),
                            "memory": torch.cuda.get_device_properties(i).total_memory}
                           for i in range(torch.cuda.device_count())]
    except Exception as err:  # noqa: BLE001 - a broken driver is a finding, not a crash
        out["cuda_error"] = repr(err)
    return out


def workbench_info() -> dict[str, Any]:
    from workbench import __version__

    return {"version": __version__, "commit": git_commit(), "path": str(package_root())}


def software(backend: str) -> dict[str, Any]:
    """A lab record's software part: Python, platform, the workbench and its commit, the
    backend, and the versions of :data:`RECORD_DISTS` (None when not installed)."""
    wb = workbench_info()
    sw: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                          "workbench": wb["version"], "workbench_git": wb["commit"],
                          "backend": backend}
    for name in RECORD_DISTS:
        sw[name] = dist_version(name)
    return sw
