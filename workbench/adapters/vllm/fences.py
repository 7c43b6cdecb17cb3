"""Fences for deferred page release: on a CUDA device, an event recorded on the stream the model
runs on; elsewhere none (the host device's work is done when the call returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fence_factory(device: Any) -> Callable[[], Any] | None:
    index = getattr(device, "index", None)
    if not hasattr(device, "tensor") or index is None or not str(device.name).startswith("cuda"):
        return None
    import torch

    def record():
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(index))
        return ev

    return record
