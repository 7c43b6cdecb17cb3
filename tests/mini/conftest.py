"""The tiny model's matrices are small: one CPU thread is faster than several, and a busy CI box
with oversubscribed threads is 30x slower (measured), so the mini tests pin torch to one."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread():
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
