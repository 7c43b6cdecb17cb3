"""One SGLang KV pool (autopatched) in its own process, driven by JSON lines on stdin.

Used by ``tests/gpu/test_sglang_gpu.py`` for what needs two processes: two engines' pools
sharing one GPU, and a ``workbench kvctl limit`` from another process. Replies one JSON line per
command: ``{"ok": true, ...}``; the device's free memory is read after a synchronize.
"""

from __future__ import annotations

import json
import sys

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

DEV = "cuda"


class Owner:
    def __init__(self):
        self.kv = self.alloc = None
        self.held: list[torch.Tensor] = []

    def state(self) -> dict:
        torch.cuda.synchronize()
        led = self.kv.ledger
        return {"mapped": led.mapped_bytes, "free": torch.cuda.mem_get_info()[0],
                "held_slots": sum(t.numel() for t in self.held), "limit": led.limit_bytes,
                "outcome": led.limit_state.outcome.value, "page_id": led.geometry.page_id_bytes,
                "capacity": led.capacity_bytes, "pool": type(self.kv).__name__,
                "zero": led.device.zero.held_bytes}  # zero pieces: made once per size

    def open(self, size: int, layers: int) -> dict:
        self.kv = MHATokenToKVPool(size=size, page_size=1, dtype=torch.float16, head_num=8,
                                   head_dim=128, layer_num=layers, device=DEV,
                                   enable_memory_saver=False, enable_alt_stream=False)
        self.alloc = TokenToKVPoolAllocator(size=size, dtype=torch.float16, device=DEV,
                                            kvcache=self.kv, need_sort=False)
        return self.state()

    def take(self, n: int) -> dict:
        got = self.alloc.alloc(n)
        if got is not None:
            self.held.append(got)
        return {"got": None if got is None else int(got.numel()), **self.state()}

    def free_all(self) -> dict:
        for t in self.held:
            self.alloc.free(t)
        self.held.clear()
        return self.state()

    def poll(self) -> dict:
        self.alloc.available_size()  # what any allocation does first: finished releases
        self.kv.ledger.alloc(0)  # ... and a pending kvctl request
        return self.state()


def main() -> None:
    owner = Owner()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("cmd")
        if op == "quit":
            print(json.dumps({"ok": True}), flush=True)
            return
        try:
            out = {"ok": True, **getattr(owner, op)(**cmd)}
        except Exception as err:  # noqa: BLE001 - the test prints it
            out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
