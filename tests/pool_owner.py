"""A pool owner in its own process for the control-plane tests: a 10-page pool (8 MiB pages)
with pages 0..4 in use, driven over stdin. ``free`` frees them all (answers ``freed``),
``quit`` or end of input closes the pool (answers ``closed``), anything else polls the control
segment (answers ``polled``). It prints ``ready`` once the pool is open."""

from __future__ import annotations

import subprocess
import sys
import textwrap

OWNER = textwrap.dedent("""
    import sys, time
    from workbench.config import PoolConfig
    from workbench.core.geometry import KVGeometry
    from workbench.core.ledger import KVCacheManager
    from workbench.sim.device import SimDevice
    geo = KVGeometry(num_layers=2, kv_heads=8, head_dim=128, num_blocks=640)  # 10 x 8 MiB
    kv = KVCacheManager(geo, SimDevice(), name=sys.argv[1],
                        config=PoolConfig(ipc_name=sys.argv[1], min_reserved_pages=1,
                                          max_reserved_pages=2))
    held = [kv.alloc(63)] + [kv.alloc(64) for _ in range(4)]   # pages 0..4 in use
    print("ready", flush=True)
    while True:                      # an engine's step loop: alloc/free poll the segment
        line = sys.stdin.readline().strip()
        if line == "free":
            while held:
                kv.free(held.pop())
            print("freed", flush=True)
        elif line == "quit" or not line:
            kv.close()
            print("closed", flush=True)
            break
        else:
            kv.poll_control()
            print("polled", flush=True)
""")


def spawn_owner(name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The owner of pool ``name`` (text pipes on stdin and stdout); the caller reads ``ready``."""
    return subprocess.Popen([sys.executable, "-c", OWNER, name], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
