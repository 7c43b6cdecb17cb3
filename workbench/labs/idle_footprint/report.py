"""The idle-footprint lab's Markdown and record."""

from __future__ import annotations

from workbench.engines.models import get_model
from workbench.labs.kit.record import LabRecord, Manifest


def markdown(rows: list[dict]) -> str:
    n = rows[0]["requests"]
    md = ["# Idle footprint after prefix-heavy traffic (simulated)", "",
          f"Qwen3-4B geometry, cap 16,000 tokens, {n} requests. Pages of 144 MiB.", "",
          "| engine | cap eviction | cached blocks | in-use pages | reserved | floor | "
          "in-use / floor | mapped / floor |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['engine']} | {'page-aware' if r['page_aware'] else 'LRU'} | "
                  f"{r['cached_blocks']} | {r['in_use_pages']} | {r['reserved_pages']} | "
                  f"{r['floor_pages']} | {r['ratio_in_use']}x | {r['ratio_mapped']}x |")
    md += ["", "kvcached (L40, vLLM 0.22.1, 2,500 requests): 4.6x before #390, 2.3x with "
           "page-aware eviction, 1.4x with best fit too; our ledger has best fit built in.", "",
           "**Expected shape**: page-aware eviction below LRU for each engine (LRU frees single "
           "blocks scattered over many pages, so few pages empty; page-aware victims empty whole "
           "pages), and page-aware `in-use / floor` at or under the 1.15x goal, below "
           "kvcached's published 1.4x because best fit is always on here. The quick size "
           "(500 requests) fills the same 16,000-token bound, so the ratios keep their order.",
           "`mapped / floor` counts the 5..10 reserved pages a pool keeps parked; kvcached's "
           "idle GB presumably includes them (they are mapped)."]
    return "\n".join(md) + "\n"


def record(rows: list[dict], seed: int, backend: str) -> LabRecord:
    n = rows[0]["requests"]
    spec = get_model("qwen3-4b")
    return LabRecord(
        experiment_id="idle-footprint-qwen3-4b", hypothesis="page-aware eviction under a cached-"
        "token bound keeps the idle footprint within 1.15x of the packed floor",
        environment={"backend": backend, "seed": seed, "requests": n},
        model_io={"model": spec.name, "prompt": "shared prefix 256-1024 + suffix 32-128",
                  "output_tokens": "uniform 16-256"},
        cache_state="prefix cache on, bound 16,000 tokens", load={"arrival": "Poisson 32 req/s"},
        samples={"runs": len(rows)}, outcomes={"finished": n},
        ttft={}, tpot_itl={}, e2e={}, throughput={}, slo_goodput={},
        hits={r["engine"] + ("/pa" if r["page_aware"] else "/lru"):
              {"hit_tokens": r["prefix_hit_tokens"], "prompt_tokens": r["prompt_tokens"]}
              for r in rows},
        transfer_bytes=None, phase_times=None, kv={"rows": rows}, correctness=None,
        raw_data={}, verdict="see rows: ratio_in_use vs 1.15",
        mechanism="pages return only when all their blocks are free; page-aware victims empty "
                  "whole pages, LRU scatters holes",
        open_questions=["closed-loop concurrency 96 approximated by Poisson arrivals"],
        applicability="one instance, idle after a prefix-heavy burst",
        manifest=Manifest.collect(hardware={"gpu": "simulated 48 GiB device (h200 latencies)"},
                                  engine_config={"model": spec.name, "block_size": 16},
                                  kvcached_config={"max_cached_tokens": 16000}),
        results={"rows": rows})
