"""The record and Markdown of cross-engine on real engines (:mod:`.real`): per phase each engine's
peak and end mapped bytes, the budget's peak, the device's lowest free memory; the checks the
verdict is made of, each failing on its own."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.record import LabRecord
from workbench.units import MiB

V, S = "vllm", "sglang"


def phase_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    s = out["samples"]
    for ph in out["phases"]:
        inside = [x for x in s if x["phase"] == ph]
        after = ([x for x in s if x["phase"] == f"{ph} drained"] or inside)
        if ph == S:  # SGLang's end is after its cache was flushed
            after = [x for x in s if x["phase"] == "sglang flushed"] or after
        row: dict[str, Any] = {"phase": ph, "samples": len(inside)}
        for e in (V, S):
            vals = [x[e] for x in inside if x.get(e) is not None]
            row[f"{e}_peak_mib"] = round(max(vals, default=0) / MiB, 1)
            row[f"{e}_end_mib"] = round((after[-1].get(e) or 0) / MiB, 1) if after else None
        row["held_peak_mib"] = round(max((x["held"] for x in inside if "held" in x),
                                         default=0) / MiB, 1)
        row["device_free_min_mib"] = round(min((x["free"] for x in inside if "free" in x),
                                               default=0) / MiB)
        rows.append(row)
    return rows


def _holders_ok(out: dict[str, Any]) -> bool:
    """Every holder the budget names (its segment's readings, ``kvctl budget``) is a process of
    one of the two engines."""
    mine = {str(p) for ps in out["pids"].values() for p in ps}
    for got in out["kvctl_budget"].values():
        for b in got.get("budgets", {}).values():
            if b["total"] == out["budget"] and any(h["held"] and str(h["pid"]) not in mine
                                                   for h in b["holders"]):
                return False
    return all(pid in mine for x in out["samples"] for pid in (x.get("holders") or {}))


def checks(out: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, bool]:
    by = {r["phase"]: r for r in rows}
    budget = out["budget"] / MiB
    s = out["samples"]
    done, sent = sum(out["finished"].values()), sum(out["requests"].values())
    c = {
        "vllm_grows_alone": by[V][f"{V}_peak_mib"] > by["idle"][f"{V}_peak_mib"],
        "vllm_gives_back": by[V][f"{V}_end_mib"] < by[V][f"{V}_peak_mib"],
        "sglang_maps_what_vllm_released": by[S][f"{S}_peak_mib"] + by[V][f"{V}_peak_mib"]
        > budget,
        "sglang_flush_gives_back": bool(out["flush"].get("ok"))
        and by[S][f"{S}_end_mib"] < by[S][f"{S}_peak_mib"],
        # vLLM's peak plus what SGLang's cache held until the flush: bytes it could not have
        # had without the flush
        "vllm_maps_what_sglang_released": by["vllm again"][f"{V}_peak_mib"]
        + out["flush"]["mapped_before"] / MiB > budget,
        "never_above_budget": all(x["held"] <= x["total"] for x in s if "held" in x)
        and all(x[V] + x[S] <= out["budget"] for x in s
                if x.get(V) is not None and x.get(S) is not None),
        "no_request_lost": not out["lost"] and done == sent,
        "holders_are_the_engines": _holders_ok(out),
    }
    return c


def report(out: dict[str, Any]) -> tuple[LabRecord, str]:
    from workbench.labs.kit.server_report import real_markdown, real_record

    rows = phase_rows(out)
    ok = checks(out, rows)
    by = {r["phase"]: r for r in rows}
    budget = out["budget"] / MiB
    top = max((x["held"] for x in out["samples"] if "held" in x), default=0) / MiB
    done, sent = sum(out["finished"].values()), sum(out["requests"].values())
    f = out["flush"]
    fb = f["mapped_before"] / MiB
    mark = lambda *keys: "yes: " if all(ok[k] for k in keys) else "NO: "  # noqa: E731
    did = [
        ("one engine grows while the other idles at its floor",
         mark("vllm_grows_alone") + f"vLLM {by['idle'][V + '_peak_mib']:g} -> "
         f"{by[V][V + '_peak_mib']:g} MiB, SGLang at {by[V][S + '_peak_mib']:g} MiB"),
        ("the second maps what the first released (no shared metadata, one budget)",
         mark("vllm_gives_back", "sglang_maps_what_vllm_released") + f"vLLM gave back to "
         f"{by[V][V + '_end_mib']:g} MiB; SGLang peaked {by[S][S + '_peak_mib']:g} MiB "
         f"({by[S][S + '_peak_mib'] + by[V][V + '_peak_mib']:g} MiB of peaks > {budget:g})"),
        ("an idle SGLang keeps its radix cache's pages until the cache is dropped",
         mark("sglang_flush_gives_back") + f"/flush_cache {'ok' if f.get('ok') else f}: "
         f"{f['mapped_before'] / MiB:g} -> {f['mapped_after'] / MiB:g} MiB"),
        ("and the first maps what the second released",
         mark("vllm_maps_what_sglang_released") + f"vLLM peaked "
         f"{by['vllm again'][V + '_peak_mib']:g} MiB with SGLang at "
         f"{by['vllm again'][S + '_peak_mib']:g} ({by['vllm again'][V + '_peak_mib'] + fb:g} "
         f"MiB with what SGLang held before the flush > {budget:g})"),
        ("the budget is never exceeded", mark("never_above_budget") + f"held at most "
         f"{top:g} of {budget:g} MiB over {len(out['samples'])} readings (every ~50 ms)"),
        ("no request is lost", mark("no_request_lost") + f"{done}/{sent} finished in full"),
        ("the budget's holders are the two engines' processes",
         "yes" if ok["holders_are_the_engines"] else "NO"),
        ("no fairness: whoever asks first gets the pages",
         f"both busy: held peak {by['both']['held_peak_mib']:g} MiB, vLLM "
         f"{by['both'][V + '_peak_mib']:g}, SGLang {by['both'][S + '_peak_mib']:g}"
         if "both" in by else "not run (quick)"),
    ]
    bad = [k for k, v in ok.items() if not v]
    verdict = (f"supported: vLLM and SGLang each mapped what the other released under one "
               f"{budget:g} MiB budget, never over it, no request lost" if not bad
               else "refuted: " + ", ".join(bad))
    headline = (f"budget {budget:g} MiB: vLLM {by[V][V + '_peak_mib']:g} -> SGLang "
                f"{by[S][S + '_peak_mib']:g} -> (flush) vLLM "
                f"{by['vllm again'][V + '_peak_mib']:g} MiB; held at most {top:g}; "
                f"{done}/{sent} finished")
    md = real_markdown("Cross-engine: vLLM and SGLang on one device", did, rows, verdict,
                       out["engine"])
    out = {**out, "model_text": "tiny-llama: vLLM's 2 layers, SGLang's 4 (random weights)"}
    rec = real_record("cross-engine", out, "a vLLM and an SGLang on one device each map the "
                      "pages the other released, under one budget neither over-commits",
                      verdict, headline, "each engine charges every page it maps to the "
                      "device's budget segment and credits it on release; nothing else is "
                      "shared (blocks vs token slots, no common metadata)",
                      {"checks": ok}, {"phases": rows}, cache_state="vLLM prefix caching off; "
                      "SGLang radix cache on, flushed after its phase")
    return rec, md
