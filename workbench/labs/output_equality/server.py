"""Output equality on a real vLLM or SGLang (seed 000 §13): the same tokens from elastic and
stock KV, greedy and seeded sampling, prefix caching on (a second wave hits the first's blocks:
vLLM's prefix cache, SGLang's radix cache), and on a small pool under a memory limit where
requests are preempted (SGLang: retracted) and recomputed. Both kinds run their batch-invariant
mode on CUDA, so which requests share a step changes no sum."""

from __future__ import annotations

import shutil
from typing import Any, NamedTuple

from workbench.engines.real.client import Sampling
from workbench.labs.kit import server_rig as rig

WAVES = (("greedy", Sampling()), ("greedy, prefix hits", Sampling()),
         ("seeded sampling", Sampling(temperature=0.8, seed=1234)))


def _diverge(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _compare(case: str, ref: list[list[int]], got: list[list[int]],
             control: list[list[int]] | None = None) -> dict[str, Any]:
    """Prompts whose tokens match; where the first mismatch sits (output token index); and, with
    a second stock engine's tokens, how many stock itself reproduces (batching noise)."""
    diff = [i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b]
    row = {"case": case, "prompts": len(ref), "equal": len(ref) - len(diff),
           "first_diff": diff[0] if diff else None,
           "diverges_at": [_diverge(ref[i], got[i]) for i in diff][:8],
           "lost": sum(1 for t in got if not t) + sum(1 for t in ref if not t)}
    if control is not None:
        row["stock_vs_stock"] = sum(1 for a, b in zip(ref, control, strict=True) if a == b)
    return row


def _waves(tag: str, stock, elastic, prompts, n: int, waves, control=None) -> dict[str, Any]:
    rows = []
    try:
        for w, (label, sampling) in enumerate(waves):
            outs = [rig.send(e, prompts, n, sampling, first_rid=1000 * w)
                    for e in (stock, elastic, control) if e is not None]
            rows.append({"pool": tag, **_compare(label, *outs)})
            hits = [elastic.outcome(1000 * w + i).cached_tokens for i in range(len(prompts))]
            if any(h is not None for h in hits):  # SGLang says how many prompt tokens it hit
                rows[-1]["cached_tokens"] = sum(h or 0 for h in hits)
        extra = {"stock": rig.counters(stock), "elastic": rig.counters(elastic),
                 "elastic_peak_mapped": max((s.mapped_bytes for s in elastic.samples),
                                            default=0),
                 "elastic_capacity": elastic.kv_pool.capacity_bytes}
    except Exception as err:  # the rows so far stay; the failure is one row of its own
        rows.append({"pool": tag, "case": "error", "prompts": 0, "equal": 0,
                     "first_diff": None, "lost": 1, "error": f"{type(err).__name__}: {err}"})
        extra = {}
    return {"rows": rows, "engines": extra}


class SmallPool(NamedTuple):
    """What a kind's run is given: every engine's spec fields; the small pair's pool (its size
    in the kind's unit, the field that sets it, whether that unit is a token slot); elastic's
    limit there; whether batch invariance is forced."""

    spec: dict
    small: dict
    size: int
    field: str
    in_slots: bool
    limit: str
    invariant: bool


def _sglang_kw(cpu: bool, n_prompts: int) -> SmallPool:
    # SGLang: a pool of 8192 token slots (the tiny model's 16 KiB each: 128 MiB) for every
    # engine; the small elastic one 2048 slots under 16 MiB (1024 slots, 8 page ids of 2 MiB)
    # that its requests outgrow (192 new tokens each), so SGLang retracts and recomputes.
    # Deterministic inference is SglangSpec's default (batch-invariant kernels).
    return SmallPool({"max_total_tokens": 8192}, {"max_num_seqs": n_prompts}, 2048,
                     "max_total_tokens", True, "16MiB", True)


def _vllm_kw(cpu: bool, n_prompts: int) -> SmallPool:
    # the small elastic engine under a one-page-id limit (4 MiB for the tiny model: 2 layers of
    # 2 MiB pages on the CPU, one CONTIGUOUS page id on CUDA) that its requests outgrow (192 new
    # tokens each), so it preempts and recomputes. On CUDA, vLLM's batch-invariant mode (no
    # split-K GEMMs, one attention reduction order): which requests share a step then changes
    # no sum, so a token that differs is the layout's
    inv = {} if cpu else {"env": {"VLLM_BATCH_INVARIANT": "1"}}
    return SmallPool(inv, {"max_num_seqs": n_prompts}, 64 if cpu else 256, "num_gpu_blocks",
                     False, "4MiB", bool(inv))


# kind -> its SmallPool; a kind not listed: vLLM's
KIND_KW = {"vllm": _vllm_kw, "sglang": _sglang_kw}


def at_limit(elastic, pool: SmallPool) -> int:
    """The small pool that gives stock what the limit leaves the elastic engine: the whole page
    ids under its limit, in the kind's unit. Recompute after a preemption is not bit-equal to
    incremental decode (a prefill's kernels sum in another order than a decode's), so the
    reference for an engine that preempts is stock preempting the same requests at the same
    steps, which the same capacity gives it (vLLM schedules by block counts alone)."""
    seg = elastic.kv_pool.info()
    if seg is None:
        raise RuntimeError(f"{elastic.name} published no pool segment: its limit is unknown")
    size, per_page = elastic.blocks_per_page(seg.page_id_bytes)
    units = (seg.limit // seg.page_id_bytes) * per_page
    return units * size if pool.in_slots else units


def run(backend: str, quick: bool = False, limit: str | None = None,
        kind: str = "vllm", runner: str | None = None) -> dict[str, Any]:
    py = rig.python_for("output-equality", kind)
    root = rig.workroot()
    cpu = rig.device_of(backend) == "cpu"
    n_prompts, n_tokens = (4, 24) if quick else (8, 48)
    prompts = rig.prompts(n_prompts, shared=64, tail=8, seed=0)
    pool = KIND_KW.get(kind, _vllm_kw)(cpu, n_prompts)
    lim = limit or pool.limit
    knobs = {"memory_limit": lim, "min_reserved_pages": "0", "max_reserved_pages": "1"}
    engines: list = []
    try:
        model = rig.model_dir(py, root, kind)

        def eng(name: str, elastic: bool, **kw):
            return rig.engine(name, backend, model, py, root, elastic=elastic, kind=kind,
                              runner=runner, **{**pool.spec, **kw})

        small = {**pool.small, pool.field: pool.size}
        engines = [eng("oe-default-stock", False), eng("oe-default-elastic", True),
                   eng("oe-small-elastic", True, knobs=knobs, **small)]
        if not quick:  # a second stock engine: what stock itself reproduces under batching
            engines.append(eng("oe-default-stock-b", False))
        rig.start_all(engines)
        stock_size = at_limit(engines[2], pool)  # once elastic's segment says its limit
        engines.append(eng("oe-small-stock", False, **{**pool.small, pool.field: stock_size}))
        rig.start_all(engines[-1:])
        big = _waves("default", *engines[:2], prompts, n_tokens, WAVES,
                     control=engines[3] if not quick else None)
        small_rows = _waves("small", engines[-1], engines[2], prompts, 192, WAVES[:1])
        return {"backend": backend, "device": rig.device_of(backend), "model": "tiny-llama",
                "engine": kind, "runner": engines[0].runner, "prompts": n_prompts,
                "max_tokens": n_tokens, "small_blocks": pool.size,
                "small_stock_blocks": stock_size, "limit": lim,
                "batch_invariant": pool.invariant,
                "rows": big["rows"] + small_rows["rows"],
                "engines": {"default": big["engines"], "small": small_rows["engines"]}}
    finally:
        for e in engines:
            e.close()
        shutil.rmtree(root, ignore_errors=True)
