"""A pool owner in its own OS process, driven by JSON lines on stdin (used by test_sharing)."""

from __future__ import annotations

import json
import sys

from workbench.config import PoolConfig
from workbench.core.geometry import KVGeometry
from workbench.core.ledger import KVCacheManager
from workbench.gpu.device import CudaDevice


def main() -> None:
    dev = CudaDevice(0, mem_info_ttl_s=0.0)
    kv = None
    held: list[int] = []
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("cmd")
        out: dict = {}
        if op == "open":
            free, total = dev.mem_info()
            util = 0.95
            if "headroom" in cmd:  # keep only `headroom` bytes of today's free memory usable
                util = 1.0 - (free - cmd.pop("headroom")) / total
            name = cmd.pop("ipc_name", None)
            cfg = PoolConfig(prealloc=False, min_reserved_pages=0, max_reserved_pages=0,
                             gpu_utilization=util,
                             ipc_name=name)
            kv = KVCacheManager(KVGeometry(**cmd), dev, name=name or "owner", config=cfg)
        elif op == "alloc":
            ids = kv.alloc(cmd["n"])
            out["got"] = None if ids is None else len(ids)
            held.extend(ids or [])
        elif op == "free_all":
            kv.free(held)
            held.clear()
        elif op == "poll":
            kv.alloc(0)  # what any alloc or free does first: apply a pending kvctl request
        elif op == "quit":
            kv.close()
            dev.close()
            print(json.dumps({"ok": True}), flush=True)
            return
        out.update(available=kv.available_size(), mapped=kv.mapped_bytes,
                   limit=kv.limit_bytes, outcome=kv.limit_state.outcome.value,
                   free=dev.mem_info().free)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
