"""Retrieve a prefix from host memory, or prefill it again? (seed 003 E5, measured.)

For each prompt length ``n``, chunk size ``c`` and concurrency ``k`` (``k`` distinct prompts
of ``n`` tokens admitted together) the mini engine runs the same prompts as three subjects:

* ``recompute``: no tier; every token is prefilled (the engine's chunked prefill);
* ``retrieve@c``: the host tier (:mod:`workbench.mini.hosttier`, chunk size ``c``) holds the
  prompts (one untimed save run before the repeats): the leading whole chunks are copied from
  pinned host memory into the VMM-backed KV, the rest is prefilled.

Each run's makespan (add to first token of the last prompt) is timed, and the retrieve runs'
loads are split into lookup, copy (issuing the host-to-device copies) and wait (until the
device has them); ``rest`` is the makespan less the loads. The subjects are interleaved within
each repeat (the order reversed every other repeat); medians and p10/p90 are over the repeats.
The crossover for a chunk size and concurrency is the shortest prompt from which the retrieve
path's median beats the recompute median at every longer prompt of the sweep.

Cells with ``k * n`` over ``max_cell_tokens`` are listed as not run (the pinned tier and the KV
pool are sized for that many tokens). The same code runs on ``host`` (the CPU's memory as the
VMM device, plain CPU tensors as the tier) for CI; its times are a CPU's, not a GPU's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbench.bench.stats import deciles
from workbench.errors import ConfigError
from workbench.units import MiB

MAX_CELL_TOKENS = 1 << 18  # 32 GiB of Llama-3.1-8B KV: more than a cell of this bench needs


@dataclass(slots=True)
class CrossoverConfig:
    backend: str = "gpu"
    model: str = "llama-3.1-8b"
    lens: tuple[int, ...] = (256, 1024, 4096, 8192)
    chunks: tuple[int, ...] = (256, 1024)
    concurrency: tuple[int, ...] = (1, 4, 16)
    repeats: int = 3
    max_cell_tokens: int = 32768  # k * n per cell; larger cells are listed, not run
    budget: int = 8192  # the engine's max_num_batched_tokens
    block_size: int = 16
    seed: int = 0
    shape: dict = field(default_factory=dict)  # ModelConfig overrides (a test-sized variant)

    def __post_init__(self) -> None:
        """Every value checked before a model is built: a bad one is one line, not a hang (a
        zero chunk never advances) or an allocation sized by a typo."""
        def bad(what: str, why: str, fix: str) -> None:
            raise ConfigError(what, why, fix)

        if not 1 <= self.max_cell_tokens <= MAX_CELL_TOKENS:
            bad(f"max_cell_tokens={self.max_cell_tokens}", "sizes the tier and the KV pool",
                f"use 1 to {MAX_CELL_TOKENS}")
        for name, lo, hi in (("lens", 1, self.max_cell_tokens),
                             ("chunks", self.block_size, self.max_cell_tokens),
                             ("concurrency", 1, self.max_cell_tokens)):
            vals = getattr(self, name)
            if not vals or any(type(v) is not int or not lo <= v <= hi for v in vals):
                bad(f"{name}={vals}", f"each value must be an integer from {lo} to {hi}",
                    f"pass e.g. --{name} {lo}" + ("" if name != "lens" else
                                                  " (and at most --max-cell-tokens)"))
        if any(c % self.block_size for c in self.chunks):
            bad(f"chunks={self.chunks}", f"a chunk is whole {self.block_size}-token blocks",
                f"use multiples of {self.block_size}")
        if not 1 <= self.repeats <= 100:
            bad(f"repeats={self.repeats}", "each cell runs 1 to 100 times", "use e.g. 3")


def _spread(xs: list[float], scale: float = 1.0) -> dict[str, float]:
    d = deciles([x * scale for x in xs])
    return {"p50": round(d["median"], 4), "p10": round(d["p10"], 4),
            "p90": round(d["p90"], 4), "n": d["n"]}


class _Rig:
    """One model, one VMM-backed engine, one host tier per chunk size."""

    def __init__(self, cfg: CrossoverConfig):
        import torch

        from workbench.backends import capabilities, require
        from workbench.mini.engine import Engine, EngineConfig
        from workbench.mini.hosttier import HostTier, HostTierConnector
        from workbench.mini.kv import KVSpec
        from workbench.mini.model import build_model, get_config

        require(cfg.backend)
        caps = capabilities(cfg.backend)
        if caps.simulated:
            raise ConfigError(f"backend {cfg.backend!r}", "the crossover runs a real engine",
                              "use --backend gpu (CUDA) or host (CPU)")
        self.torch = torch
        self.device = torch.device("cuda" if caps.cuda else "cpu")
        base = get_config(cfg.model)  # RoPE table long enough for the longest prompt + 1
        self.mcfg = get_config(cfg.model, **{"max_position": max(base.max_position,
                                                                 max(cfg.lens) + 64),
                                             **cfg.shape})
        tokens = cfg.max_cell_tokens + cfg.budget + 64 * cfg.block_size
        kv_bytes = tokens * self.mcfg.kv_bytes_per_token
        pages = -(-kv_bytes // (2 * MiB * 2 * self.mcfg.num_layers)) + 2
        spec = KVSpec(style="block", backend="vmm", kv_bytes=kv_bytes,
                      block_size=cfg.block_size, min_reserved_pages=pages,
                      max_reserved_pages=pages)  # premapped: no map calls inside the timings
        self.engine = Engine(self.mcfg, spec, self.device,
                             EngineConfig(max_num_seqs=256, max_batched_tokens=cfg.budget),
                             model=build_model(self.mcfg, self.device))
        cap = cfg.max_cell_tokens * self.mcfg.kv_bytes_per_token  # a cell's prompts, no more
        rows = self.engine.kv.block_rows()
        self.conns = {c: HostTierConnector(HostTier(rows, block_size=cfg.block_size,
                                                    chunk_tokens=c, capacity_bytes=cap))
                      for c in cfg.chunks}

    def use(self, chunk: int | None, *, saving: bool = False) -> Any:
        conn = None if chunk is None else self.conns[chunk]
        if conn is not None:
            conn.saving, conn.loading = saving, not saving
            conn.loads.clear()
            conn.saves.clear()
        self.engine.scheduler.connector = conn
        self.engine.connector = conn
        return conn

    def run(self, prompts: list[list[int]]) -> float:
        t0 = time.perf_counter()
        self.engine.generate(prompts, 1)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.engine.close()


def _subject_run(rig: _Rig, subject: int | None, prompts: list[list[int]]) -> dict[str, Any]:
    conn = rig.use(subject)
    s = rig.run(prompts)
    out: dict[str, Any] = {"s": s}
    if conn is not None:
        lds = list(conn.loads.values())
        for part in ("lookup_s", "copy_s", "wait_s"):
            out[part] = sum(getattr(ld, part) for ld in lds)
        out.update(tokens=[ld.tokens for ld in lds], nbytes=sum(ld.nbytes for ld in lds),
                   chunks=sum(ld.chunks for ld in lds), copies=sum(ld.copies for ld in lds))
    return out


def _cell(rig: _Rig, cfg: CrossoverConfig, n: int, k: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng([cfg.seed, n, k])
    prompts = [rng.integers(1, rig.mcfg.vocab_size, size=n).tolist() for _ in range(k)]
    saves = {}
    for c in cfg.chunks:  # fill each tier once (a prefill that saves; not timed as a subject)
        conn = rig.use(c, saving=True)
        rig.run(prompts)
        sv = list(conn.saves.values())
        saves[c] = {"nbytes": sum(x.nbytes for x in sv), "s": sum(x.seconds for x in sv)}
    subjects: list[int | None] = [None, *cfg.chunks]
    runs: dict[int | None, list[dict]] = {s: [] for s in subjects}
    for r in range(cfg.repeats):
        for s in (subjects if r % 2 == 0 else subjects[::-1]):
            runs[s].append(_subject_run(rig, s, prompts))
    rows = []
    for c in cfg.chunks:
        rows.append(_row(n, c, k, runs[None], runs[c], saves[c]))
    return rows


def _row(n: int, c: int, k: int, rec: list[dict], ret: list[dict], save: dict) -> dict[str, Any]:
    load = [x["lookup_s"] + x["copy_s"] + x["wait_s"] for x in ret]
    moved = [x["copy_s"] + x["wait_s"] for x in ret]
    got = ret[0]["tokens"]
    row: dict[str, Any] = {
        "prompt_len": n, "chunk": c, "concurrency": k, "retrieved_tokens": got,
        "retrieved_bytes": ret[0]["nbytes"], "chunks_moved": ret[0]["chunks"],
        "copies": ret[0]["copies"],
        "recompute_ms": _spread([x["s"] for x in rec], 1e3),
        "retrieve_ms": _spread([x["s"] for x in ret], 1e3),
        "load_ms": _spread(load, 1e3),
        "lookup_ms": _spread([x["lookup_s"] for x in ret], 1e3),
        "copy_ms": _spread([x["copy_s"] for x in ret], 1e3),
        "wait_ms": _spread([x["wait_s"] for x in ret], 1e3),
        "rest_ms": _spread([x["s"] - ld for x, ld in zip(ret, load, strict=True)], 1e3),
        "h2d_gbps": (_spread([x["nbytes"] / m for x, m in zip(ret, moved, strict=True)], 1e-9)
                     if ret[0]["nbytes"] and min(moved) > 0 else None),
        "save_gbps": round(save["nbytes"] / save["s"] / 1e9, 3) if save["s"] > 0 else None,
    }
    if not sum(got):
        row["winner"] = "nothing to retrieve"
    else:
        row["winner"] = ("retrieve" if row["retrieve_ms"]["p50"] < row["recompute_ms"]["p50"]
                         else "recompute")
    return row


def crossovers(rows: list[dict], cfg: CrossoverConfig) -> list[dict[str, Any]]:
    """Per (chunk, concurrency): the shortest prompt from which retrieval wins at every longer
    prompt of the sweep (None: it never does)."""
    out = []
    for c in cfg.chunks:
        for k in cfg.concurrency:
            mine = sorted((r for r in rows if r["chunk"] == c and r["concurrency"] == k),
                          key=lambda r: r["prompt_len"])
            at = None
            for r in reversed(mine):
                if r["winner"] != "retrieve":
                    break
                at = r["prompt_len"]
            out.append({"chunk": c, "concurrency": k, "retrieve_wins_from": at,
                        "lens_run": [r["prompt_len"] for r in mine]})
    return out


def fit_costs(rows: list[dict]) -> dict[str, float | None]:
    """Per-chunk overhead and bandwidth of the moves (least squares of copy+wait on chunks and
    bytes), lookup per chunk, and recompute seconds per token (least squares on tokens)."""
    hits = [r for r in rows if r["retrieved_bytes"]]
    if len(hits) < 2:
        return {"h2d_gbps": None, "op_us_per_chunk": None, "lookup_us_per_chunk": None,
                "recompute_us_per_token": None}
    a = np.array([[r["chunks_moved"], r["retrieved_bytes"]] for r in hits], dtype=float)
    t = np.array([(r["copy_ms"]["p50"] + r["wait_ms"]["p50"]) * 1e-3 for r in hits])
    (op, per_byte), *_ = np.linalg.lstsq(a, t, rcond=None)
    look = np.median([r["lookup_ms"]["p50"] * 1e-3 / r["chunks_moved"] for r in hits])
    rec = {(r["prompt_len"], r["concurrency"]): r["recompute_ms"]["p50"] * 1e-3 for r in rows}
    toks = np.array([[n * k, 1.0] for n, k in rec], dtype=float)
    (per_tok, _fixed), *_ = np.linalg.lstsq(toks, np.array(list(rec.values())), rcond=None)
    return {"h2d_gbps": round(float(1 / per_byte / 1e9), 3) if per_byte > 0 else None,
            "op_us_per_chunk": round(float(op) * 1e6, 3),
            "lookup_us_per_chunk": round(float(look) * 1e6, 3),
            "recompute_us_per_token": round(float(per_tok) * 1e6, 3)}


def run_crossover(cfg: CrossoverConfig, progress=None) -> dict[str, Any]:
    rig = _Rig(cfg)
    try:
        rig.use(None)
        rig.run([[1] * min(cfg.lens)])  # warm-up: kernels, handles, allocator
        for c in cfg.chunks:
            rig.use(c, saving=True)
            rig.run([[2] * (2 * c)])
            rig.use(c)
            rig.run([[2] * (2 * c)])
        rows, skipped = [], []
        cells = [(n, k) for k in cfg.concurrency for n in cfg.lens]
        for i, (n, k) in enumerate(cells):
            if n * k > cfg.max_cell_tokens:
                skipped.append({"prompt_len": n, "concurrency": k,
                                "why": f"{n * k} tokens > max_cell_tokens {cfg.max_cell_tokens}"})
                continue
            if progress:
                progress(f"cell {i + 1}/{len(cells)}: n={n} k={k}")
            rows.extend(_cell(rig, cfg, n, k))
        device = (rig.torch.cuda.get_device_name() if rig.device.type == "cuda"
                  else "cpu (host backend)")
    finally:
        rig.close()
    return {"config": asdict(cfg), "device": device,
            "kv_token_bytes": rig.mcfg.kv_bytes_per_token, "rows": rows, "not_run": skipped,
            "crossover": crossovers(rows, cfg), "fit": fit_costs(rows)}


def _bw(bw: dict | None) -> str:
    return "-" if bw is None else f"{bw['p50']:.1f} [{bw['p10']:.1f}, {bw['p90']:.1f}]"


def summary_lines(res: dict) -> list[str]:
    lines = [f"{res['device']}  {res['config']['model']}  KV {res['kv_token_bytes']} B/token  "
             f"repeats {res['config']['repeats']} (median [p10, p90])",
             "   n  chunk  k  retrieved  recompute ms           retrieve ms            "
             "load (lookup/copy/wait) ms     H2D GB/s   winner"]
    for r in res["rows"]:
        rc, rt = r["recompute_ms"], r["retrieve_ms"]
        bw = r["h2d_gbps"]
        lines.append(
            f"{r['prompt_len']:>5} {r['chunk']:>5} {r['concurrency']:>2} "
            f"{sum(r['retrieved_tokens']):>8}  {rc['p50']:8.2f} [{rc['p10']:.2f}, {rc['p90']:.2f}]"
            f"  {rt['p50']:8.2f} [{rt['p10']:.2f}, {rt['p90']:.2f}]  "
            f"{r['load_ms']['p50']:.2f} ({r['lookup_ms']['p50']:.2f}/{r['copy_ms']['p50']:.2f}/"
            f"{r['wait_ms']['p50']:.2f})  "
            f"{_bw(bw)}  "
            f"{r['winner']}")
    for x in res["crossover"]:
        lines.append(f"crossover chunk {x['chunk']} k={x['concurrency']}: retrieval wins from "
                     f"{x['retrieve_wins_from'] or 'never in the sweep'} tokens")
    for s in res["not_run"]:
        lines.append(f"not run: n={s['prompt_len']} k={s['concurrency']} ({s['why']})")
    lines.append(f"fit: {res['fit']}")
    return lines
