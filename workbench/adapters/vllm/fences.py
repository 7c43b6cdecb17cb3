"""Fences for deferred page release: on a device with queued work (CUDA), an event recorded on
the stream the model runs on; elsewhere none (the host device's work is done when the call
returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fence_factory(device: Any) -> Callable[[], Any] | None:
    """A fence recorder for ``device``, or None where its work is done when a call returns: the
    device says so (``queued_work``, and the torch device its memory is on), as for
    :func:`workbench.adapters.runtime.make_ledger`."""
    if not device.queued_work:
        return None
    import torch

    index = torch.device(device.torch_device).index

    def record():
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(index))
        return ev

    return record
