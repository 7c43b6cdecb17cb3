"""The differential test's two halves: seeded random op traces, and replaying one on two backends.

A trace is a list of :mod:`workbench.core.replay` ops (one or two pools, then alloc / free /
limit / trim / refill / fail). Pools stay small (a few hundred MiB), so device headroom never
binds and the only failures are the injected ones: both backends must then emit the same event
keys. Nothing here imports torch or cuda-python.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, NamedTuple

from workbench.core.device import VMM_OPS
from workbench.core.replay import ReplayResult, replay
from workbench.units import MiB

FAULT_OPS = tuple(op for op in VMM_OPS if op != "reserve")


def _pool_op(rng: random.Random, name: str) -> dict:
    mla = rng.random() < 0.2
    layers = rng.choice((1, 2, 4))
    heads = 1 if mla else rng.choice((1, 2, 8))
    head_dim = rng.choice((64, 128)) if not mla else 576
    block_size = rng.choice((1, 16)) if mla else rng.choice((8, 16, 32))
    block_bytes = block_size * heads * head_dim * 2
    per_page = (2 * MiB) // block_bytes
    pages = rng.randint(3, 12)
    mn = rng.randint(0, 2)
    op = {"op": "pool", "pool": name, "num_layers": layers, "kv_heads": heads,
          "head_dim": head_dim, "mla": mla, "block_size": block_size,
          "num_blocks": per_page * pages - rng.randint(0, per_page - 1),
          "layout": rng.choice(("contiguous", "per_layer")),
          "prealloc": rng.random() < 0.5, "min_reserved": mn,
          "max_reserved": mn + rng.randint(0, 3)}
    if rng.random() < 0.25:
        op["memory_limit"] = rng.randint(1, pages) * (2 * MiB) * layers * (1 if mla else 2)
    return op


def random_trace(seed: int, n_ops: int = 40) -> list[dict]:
    """A reproducible trace with limits (applied, deferred, stale, rejected) and faults."""
    rng = random.Random(seed)
    pools = [_pool_op(rng, "a")] + ([_pool_op(rng, "b")] if rng.random() < 0.4 else [])
    ops: list[dict] = list(pools)
    live: dict[str, list[str]] = {p["pool"]: [] for p in pools}
    tag = 0
    for _ in range(n_ops):
        p = rng.choice(pools)
        name = p["pool"]
        per_page = max(1, (2 * MiB) // (p["block_size"] * p["kv_heads"] * p["head_dim"] * 2))
        page_id = 2 * MiB * p["num_layers"] * (1 if p["mla"] else 2)
        pages = -(-p["num_blocks"] // per_page)
        r = rng.random()
        if r < 0.38:
            tag += 1
            n = rng.choice((1, rng.randint(1, per_page), rng.randint(per_page, 3 * per_page)))
            ops.append({"op": "alloc", "pool": name, "n": n, "tag": f"t{tag}"})
            live[name].append(f"t{tag}")
        elif r < 0.65:
            if live[name]:
                t = live[name].pop(rng.randrange(len(live[name])))
                ops.append({"op": "free", "pool": name, "tag": t})
        elif r < 0.77:
            lim: dict[str, Any] = {"op": "limit", "pool": name}
            k = rng.random()
            if k < 0.08:
                lim["bytes"] = (pages + 2) * page_id  # above capacity: rejected
            elif k < 0.14:
                lim["bytes"] = page_id // 2  # below the null block's page: rejected
            else:
                lim["bytes"] = rng.randint(1, pages) * page_id + rng.choice((0, MiB))
            if rng.random() < 0.15:
                lim["revision"] = rng.randint(0, 3)  # sometimes stale or a conflict
            ops.append(lim)
        elif r < 0.83:
            ops.append({"op": "trim", "pool": name})
        elif r < 0.88:
            ops.append({"op": "refill", "pool": name})
        else:
            ops.append({"op": "fail", "call": rng.choice(FAULT_OPS), "nth": rng.randint(1, 3)})
    return ops


class DiffResult(NamedTuple):
    seed: int
    equal: bool
    keys_a: list[tuple]
    keys_b: list[tuple]
    first_diff: int  # index of the first differing event key, -1 if equal

    def explain(self) -> str:
        if self.equal:
            return f"seed {self.seed}: {len(self.keys_a)} events, identical"
        i = self.first_diff
        a = self.keys_a[i] if i < len(self.keys_a) else None
        b = self.keys_b[i] if i < len(self.keys_b) else None
        return f"seed {self.seed}: event {i} differs: {a} vs {b}"


def _snap(res: ReplayResult) -> dict:
    return {n: (s.counts, s.page_states, s.used_blocks, s.limit_pages, s.failed is None)
            for n, s in res.pools.items()}


def run_both(ops: list[dict], make_a: Callable[..., Any], make_b: Callable[..., Any],
             seed: int = -1, cleanup: Callable[[Any], None] | None = None) -> DiffResult:
    """Replay ``ops`` on two device factories; ``cleanup(device)`` runs on each device after."""
    made: list[Any] = []

    def keep(factory: Callable[..., Any]) -> Callable[..., Any]:
        def make(**kw: Any) -> Any:
            made.append(factory(**kw))
            return made[-1]
        return make

    try:
        ra = replay([dict(o) for o in ops], keep(make_a))
        rb = replay([dict(o) for o in ops], keep(make_b))
    finally:
        if cleanup is not None:
            for dev in made:
                cleanup(dev)
    ka, kb = ra.events.keys(), rb.events.keys()
    equal = ka == kb and _snap(ra) == _snap(rb)
    first = -1
    if not equal:
        pairs = enumerate(zip(ka, kb, strict=False))
        first = next((i for i, (x, y) in pairs if x != y), min(len(ka), len(kb)))
    return DiffResult(seed, equal, ka, kb, first)


def write_trace(ops: list[dict], path: str) -> None:
    """Save ``ops`` as a JSON-lines trace that ``workbench replay`` reads."""
    import json

    from workbench.outfiles import write_text

    write_text(path, "".join(json.dumps(op) + "\n" for op in ops), "PATH")


def main(argv: list[str]) -> int:
    """``python -m workbench.bench.difftrace SEED PATH``: a random trace, for ``replay``."""
    from workbench.errors import ConfigError
    from workbench.outfiles import check

    if len(argv) != 2 or not argv[0].isascii() or not argv[0].isdigit():
        raise ConfigError("difftrace", f"takes SEED PATH, got {len(argv)} arguments"
                          if len(argv) != 2 else f"SEED {argv[0]!r} is not a whole number",
                          "run python -m workbench.bench.difftrace 7 trace.jsonl")
    check(argv[1], "PATH")
    write_trace(random_trace(int(argv[0])), argv[1])
    return 0


if __name__ == "__main__":
    import sys

    from workbench.outfiles import run_main

    sys.exit(run_main(main, sys.argv[1:]))
