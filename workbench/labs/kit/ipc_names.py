"""Same vs separate IPC names (seed 000 §4.2, §7.1), exactly as the workbench's control plane
behaves: this creates real control segments (:mod:`workbench.core.control`) for two small
simulated pools on one device, sends a limit request through the same path ``kvctl limit`` uses
(:func:`workbench.core.limit_requests.request_limit`), and removes the segments again.

What the workbench does: one IPC name is one pool's segment. Separate names give two segments,
each observed and limited on its own. A second pool asking for a name a live pool holds is
refused at creation; the name is free again once its owner closes. What it does not model: the
seed's *shared* name, where several instances form one observation / limit domain (one limit
over their summed usage); the workbench has no group segment. Physical headroom is shared either
way: both pools map from the one device.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.control import read_segment
from workbench.core.device import Device
from workbench.core.limit_requests import request_limit
from workbench.engines.models import get_model
from workbench.engines.sim.kvsetup import elastic_pool
from workbench.errors import ConfigError
from workbench.units import GiB


def _seg(name: str) -> dict[str, Any] | None:
    info = read_segment(name)
    if info is None:
        return None
    return {"mapped": info.mapped, "limit": info.limit, "revision": info.revision,
            "used_blocks": info.used_blocks, "owner_pid": info.owner_pid}


def ipc_names_demo(model: str = "llama-3.1-8b", device_gib: float = 4.0,
                   prefix: str | None = None) -> dict[str, Any]:
    """Run the separate-names and same-name cases; every step's observation, in order."""
    prefix = prefix or f"wblab-{os.getpid()}-{secrets.token_hex(3)}"
    names = (f"{prefix}-a", f"{prefix}-b")
    spec = get_model(model)
    dev = make_device("sim", preset="h200", capacity=int(device_gib * GiB), name="ipc-demo")
    cfg = {n: PoolConfig(ipc_name=n, prealloc=False) for n in names}
    pools = [elastic_pool(spec, dev, name=n, config=cfg[n]).kv for n in names]
    a, b = pools
    steps: list[dict[str, Any]] = []
    try:
        page = a.geometry.page_id_bytes
        bpp = a.geometry.page_size // a.geometry.block_bytes
        steps.append({"step": "two pools, separate names", "a": _seg(names[0]),
                      "b": _seg(names[1]), "b_available_blocks": b.available_size()})
        held = a.alloc(3 * bpp)  # a maps three more pages
        steps.append({"step": "a maps 3 pages", "a": _seg(names[0]), "b": _seg(names[1]),
                      "b_available_blocks": b.available_size()})
        ans = request_limit(names[0], 2 * page, wait_s=0.0)  # as `kvctl limit` writes it
        steps.append({"step": "limit request for a (2 page ids)", "answer": ans.answer,
                      "a": _seg(names[0]), "b": _seg(names[1])})
        a.free(held)  # the owner polls its segment on every alloc and free
        steps.append({"step": "a frees its blocks (polls the request)", "a": _seg(names[0]),
                      "b": _seg(names[1]), "a_limit_bytes": a.limit_bytes,
                      "b_limit_bytes": b.limit_bytes})
        same = _try_same(spec, dev, names[0])
        steps.append({"step": "a third pool asks for a's name", **same})
        a.close()
        reuse = elastic_pool(spec, dev, name="c", config=cfg[names[0]]).kv
        steps.append({"step": "a closes; a new pool takes the name", "a_name": _seg(names[0])})
        pools.append(reuse)
    finally:
        for p in pools:
            p.close()
    return {"names": list(names), "page_id_bytes": a.geometry.page_id_bytes,
            "device_bytes": dev.capacity, "steps": steps,
            "left_behind": [n for n in names if read_segment(n) is not None]}


def _try_same(spec, dev: Device, name: str) -> dict[str, Any]:
    """A pool asking for a held name; what the device kept of the refused construction (the pool
    maps its null block's page before it claims the name, and gives it back when refused)."""
    free0 = dev.mem_info().free
    try:
        extra = elastic_pool(spec, dev, name="dup", config=PoolConfig(ipc_name=name,
                                                                      prealloc=False)).kv
    except ConfigError as err:
        return {"refused": True, "error": str(err).splitlines()[0],
                "left_mapped_bytes": free0 - dev.mem_info().free}
    extra.close()
    return {"refused": False, "error": None, "left_mapped_bytes": free0 - dev.mem_info().free}


def summary(demo: dict[str, Any]) -> dict[str, Any]:
    """The facts the lab states, read off the demo's steps."""
    s = {d["step"]: d for d in demo["steps"]}
    start, mapped = s["two pools, separate names"], s["a maps 3 pages"]
    limited = s["a frees its blocks (polls the request)"]
    page = demo["page_id_bytes"]
    return {
        "separate_segments": start["a"] is not None and start["b"] is not None,
        "a_mapped_seen_only_in_a": mapped["a"]["mapped"] - start["a"]["mapped"] == 3 * page
        and mapped["b"]["mapped"] == start["b"]["mapped"],
        "headroom_shared": mapped["b_available_blocks"] < start["b_available_blocks"],
        "limit_pending_until_poll": s["limit request for a (2 page ids)"]["answer"] == "pending",
        "limit_applies_to_a_only": limited["a"]["limit"] == 2 * page
        and limited["b"]["limit"] == start["b"]["limit"],
        "same_name_refused": s["a third pool asks for a's name"]["refused"],
        "same_name_error": s["a third pool asks for a's name"]["error"],
        "refused_pool_left_mapped_bytes": s["a third pool asks for a's name"][
            "left_mapped_bytes"],
        "name_free_after_close": s["a closes; a new pool takes the name"]["a_name"] is not None,
        "segments_removed": demo["left_behind"] == []}
