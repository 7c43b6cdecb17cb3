"""The same-engine-pair lab's Markdown and record (:mod:`workbench.labs.same_engine_pair.sim`)."""

from __future__ import annotations

from typing import Any

from workbench.engines.models import get_model
from workbench.labs.kit.phase_figs import latency_lines
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.units import MiB

EXPECT = [
    ("B", "the peaking instance maps pages; the idle one stays at its floor",
     ("B_first_grows", "B_second_flat")),
    ("C", "the drained instance gives back its empty pages; the other grows into that memory",
     ("C_first_gives_back", "C_second_grows_into_freed")),
    ("all", "together they never map more than the device lets them (one physical headroom)",
     ("never_above_budget",)),
    ("D", "both peak: together they fill the headroom, both wait longer than alone",
     ("D_at_budget", "D_slower_than_alone")),
    ("E", "a graceful exit returns every page (reserve and null block too); the other grows "
          "past what it had in D", ("E_first_released_all", "E_second_grows_past_D")),
    ("all", "no page holding a live block is ever unmapped", ("live_unmaps",)),
]

IPC_EXPECT = [
    ("separate names: each pool has its own segment, its own numbers",
     ("separate_segments", "a_mapped_seen_only_in_a")),
    ("separate names: a limit reaches only the pool it names (applied on the owner's next "
     "alloc or free)", ("limit_pending_until_poll", "limit_applies_to_a_only")),
    ("physical headroom is shared whatever the names", ("headroom_shared",)),
    ("same name: the seed's one observation/limit domain; the workbench refuses a second "
     "live owner", ("same_name_refused",)),
    ("the name is free again after its owner closes; no segment is left behind",
     ("name_free_after_close", "segments_removed")),
]


def _ok(c: dict, key: str) -> bool:
    return c[key] == 0 if key == "live_unmaps" else bool(c[key])


def markdown(p: Any, data: dict, rows: list[dict], ipc: dict | None) -> str:
    checks = [r["checks"] for r in data["runs"]]
    lines = ["# Two same-kind instances on one device (simulated)", "",
             f"Two {p.kind}-like {p.model} instances on a simulated {p.gpu} whose KV headroom is "
             f"{p.kv_budget_gib:g} GiB; seed 000 §7. A peak is {p.peak_rate:g} req/s of "
             f"{p.prompt_len}/{p.output_len} tokens for {p.phase_s:g} s, the same traffic in "
             f"every peak phase. {len(checks)} runs (seeds "
             f"{[r['seed'] for r in data['runs']]}), the instance that peaks first alternating.",
             "", "## The seed's phases beside the measurement", "",
             "| phase | expected | measured (runs that agree) |", "|---|---|---|"]
    for ph, text, keys in EXPECT:
        agree = sum(all(_ok(c, k) for k in keys) for c in checks)
        lines.append(f"| {ph} | {text} | {agree}/{len(checks)} |")
    lines += ["", "## Per phase (first run)", "",
              "| instance | phase | req | peak GiB | end GiB | reserve end | TTFT p50 / p99 ms | "
              "E2E p99 ms | preemptions |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lat = (f"{r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['e2e_p99_ms']} | "
               f"{r['preemptions']}" if "ttft_p50_ms" in r else "- | - | -")
        lines.append(f"| {r['instance']} | {r['phase']} | {r['requests']} | "
                     f"{r['peak_mapped_gib']} | {r['end_mapped_gib']} | "
                     f"{r['end_reserved_pages']} | {lat} |")
    lines += latency_lines({f"seed {r['seed']} (first: instance {r['first']})": [r["run"]]
                            for r in data["runs"]}, "Latency per run and phase")
    c0 = checks[0]
    lines += ["", "## Reading it", "",
              f"* In C the drained instance ({c0['first']}) keeps its null block's page and a "
              "reserve of up to max_reserved_pages parked pages: that much of what it held at "
              "its peak does not move to the other instance until it exits (E).",
              "* In D nothing divides the headroom: whoever allocates first holds the pages until "
              "its requests finish; the other misses, preempts and queues. Nothing here is fair "
              "by design (the cross-engine lab shows one instance starving the other).",
              "* TTFT is the scheduler's queueing plus the roofline step times; both instances "
              "time-slice one simulated GPU, so D is slower also for compute, not only memory."]
    if ipc:
        lines += ["", "## Same vs separate IPC names (the workbench's control plane)", "",
                  "| seed 000 §4.2 / §7.1 | measured |", "|---|---|"]
        for text, keys in IPC_EXPECT:
            lines.append(f"| {text} | {'yes' if all(ipc[k] for k in keys) else 'no'} |")
        lines += ["", f"The refusal reads: `{ipc['same_name_error']}`.", "",
                  "What the workbench does **not** model: a name shared by several instances as "
                  "one domain (kvctl seeing their summed usage, one limit over all of them). "
                  "Here a name is one pool's segment; a group would need a segment with several "
                  "owners, which does not exist.", "", _refusal_cost(ipc)]
    return "\n".join(lines) + "\n"


def _refusal_cost(ipc: dict) -> str:
    left = ipc["refused_pool_left_mapped_bytes"]
    if left:
        return (f"Observed: the refused pool had already mapped {left} bytes (its null block's "
                "page) before it claimed the name, and they stay mapped after the refusal: the "
                "pool maps before it claims its name and does not undo that when the claim "
                "fails.")
    return "The refused pool left nothing mapped on the device."


def record(p: Any, data: dict, rows: list[dict], ipc: dict | None, ipc_sum: dict | None,
           backend: str) -> LabRecord:
    spec = get_model(p.model)
    runs = data["runs"]
    checks = [r["checks"] for r in runs]
    ok = all(all(_ok(c, k) for _, _, keys in EXPECT for k in keys) for c in checks)

    def per(key: str) -> dict:
        return {f"seed{r['seed']}/{i['name']}": i["summary"][key] for r in runs
                for i in r["run"]["instances"]}

    first = runs[0]["run"]["instances"][0]["summary"]
    return LabRecord(
        experiment_id=f"same-engine-pair-{p.kind}-{p.model}",
        hypothesis="pages freed by one instance are mapped by the other; together they share "
                   "one physical headroom; a graceful exit returns everything",
        environment={"backend": backend, "seeds": [r["seed"] for r in runs],
                     "kv_budget_gib": p.kv_budget_gib,
                     "command": "workbench labs run same-engine-pair --backend sim"},
        model_io={"model": spec.name, "prompt": p.prompt_len, "output": p.output_len},
        cache_state="prefix cache off (both)",
        load={"phases": list(("A", "B", "C", "D", "E", "tail")), "peak_rate": p.peak_rate,
              "phase_s": p.phase_s},
        samples={"runs": len(runs), "first_peaking": [r["first"] for r in runs]},
        outcomes=per("finished"), ttft=per("ttft"),
        tpot_itl={"tpot": per("tpot"), "itl": per("itl")}, e2e=per("e2e"),
        throughput={k: first[k] for k in ("req_per_s", "input_tok_per_s", "output_tok_per_s")},
        slo_goodput={"goodput_req_per_s": per("goodput_req_per_s")},
        hits={"local": 0, "denominator": "prefix caching off"},
        transfer_bytes=None, phase_times=None,
        kv={"checks": checks, "preemptions": per("preemptions")}, correctness=None,
        raw_data={"timeline": "results.timeline (first run, 0.1 s)"},
        verdict=("supported" if ok else "refuted: see kv.checks") + (
            "" if ipc_sum is None else "; IPC: separate names isolate observation and limits, "
            "a second owner of one name is refused"),
        mechanism="pages are unmapped only when empty and beyond the reserve; the device's free "
                  "memory is the one headroom both pools map from, first come first served",
        open_questions=["a shared IPC name as one domain is not modelled",
                        "GPU compute sharing is step-granular time slicing"],
        applicability=f"two {p.kind}-like instances, TP 1, a {p.kv_budget_gib:g} GiB headroom",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {p.gpu}", "kv_budget_gib": p.kv_budget_gib},
            engine_config={"engine": f"{p.kind}-like (sim)", "model": spec.name,
                           "instances": 2},
            kvcached_config={"ipc_name": "separate (demo: both cases)", "page_size": 2 << 20,
                             "min_reserved_pages": 5, "max_reserved_pages": 10,
                             "max_cached_tokens": -1}),
        results={"phases": rows, "timeline": runs[0]["run"]["timeline"],
                 "windows": runs[0]["run"]["windows"], "ipc": ipc, "ipc_summary": ipc_sum})


# the real run's phases are the seed's B (A busy), C (A drained, B busy) and D (both busy)
def _phase_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Per phase of the real run: each engine's peak and end mapped bytes, the budget's peak."""
    rows = []
    s = out["samples"]
    extra = ["E after gc"] if any(x["phase"] == "E after gc" for x in s) else []
    for ph in [*out["phases"], *extra]:
        inside = [x for x in s if x["phase"] == ph]
        after = [x for x in s if x["phase"] == f"{ph} drained"] or inside
        row: dict[str, Any] = {"phase": ph, "samples": len(inside)}
        for e in ("A", "B"):
            vals = [x[e] for x in inside if x.get(e) is not None]
            row[f"{e}_peak_mib"] = round(max(vals, default=0) / MiB, 1)
            row[f"{e}_end_mib"] = round((after[-1].get(e) or 0) / MiB, 1) if after else None
        held = [x["held"] for x in inside if "held" in x]
        row["held_peak_mib"] = round(max(held, default=0) / MiB, 1)
        both = [x["A"] + x["B"] for x in inside if x.get("A") is not None
                and x.get("B") is not None]
        row["sum_peak_mib"] = round(max(both, default=0) / MiB, 1)
        frees = [x["free"] for x in inside if "free" in x]
        row["device_free_min_mib"] = round(min(frees, default=0) / MiB)
        rows.append(row)
    return rows


def real_checks(out: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, bool]:
    by = {r["phase"]: r for r in rows}
    budget = out["budget"] / MiB
    page = out["page_id_bytes"] / MiB
    s = out["samples"]
    checks = {
        "B_first_grows": by["A"]["A_peak_mib"] > by["idle"]["A_peak_mib"],
        "B_second_flat": by["A"]["B_peak_mib"] <= by["idle"]["B_peak_mib"],
        "C_first_gives_back": by["A"]["A_end_mib"] < by["A"]["A_peak_mib"],
        "C_second_grows_into_freed": by["B"]["B_peak_mib"] + by["A"]["A_peak_mib"] > budget,
        "never_above_budget": all(x["held"] <= x["total"] for x in s if "held" in x)
        and all(x["A"] + x["B"] <= out["budget"] for x in s
                if x.get("A") is not None and x.get("B") is not None),
        "no_request_lost": not out["lost"] and out["finished"] == out["requests"],
        "holders_are_the_engines": _holders_ok(out),
    }
    if "both" in by:
        checks["D_at_budget"] = by["both"]["held_peak_mib"] >= budget - page
        t = out.get("ttft_ms") or {}
        if t:
            checks["D_slower_than_alone"] = all(t["both"][e]["p99"] > t[e][e]["p99"]
                                                for e in ("A", "B"))
    if "E" in by:
        gone = [x for x in s if x["phase"] == "E drained"]
        checks["E_first_released_all"] = (_held_by(out, "E", "A") == 0 and bool(gone)
                                          and gone[-1].get("A") is None)
        late = max(by["E"]["B_peak_mib"], by.get("E after gc", {}).get("B_peak_mib", 0))
        checks["E_second_grows_past_D"] = late > by["both"]["B_peak_mib"]
    return checks


def _held_by(out: dict[str, Any], phase: str, engine: str) -> int:
    """Bytes ``kvctl budget`` showed held by ``engine``'s processes (alive or not) mid-phase."""
    mine = {str(p) for p in out["pids"][engine]}
    return sum(h["held"] for b in out["kvctl_budget"].get(phase, {}).get("budgets", {}).values()
               if b["total"] == out["budget"] for h in b["holders"] if str(h["pid"]) in mine)


def _holders_ok(out: dict[str, Any]) -> bool:
    """Every holder ``kvctl budget`` named is one of the two engines' processes, and in the
    budget segment's readings the busy engine's peak share passes the idle one's."""
    mine = {str(p): e for e, ps in out["pids"].items() for p in ps}
    for got in out["kvctl_budget"].values():
        for b in got.get("budgets", {}).values():
            if b["total"] == out["budget"] and any(
                    h["held"] and str(h["pid"]) not in mine for h in b["holders"]):
                return False
    for ph, idle in (("A", "B"), ("B", "A")):
        peak = {e: 0 for e in ("A", "B")}
        for x in out["samples"]:
            if x["phase"] == ph:
                for pid, held in (x.get("holders") or {}).items():
                    e = mine.get(pid)
                    if e is None:
                        return False
                    peak[e] = max(peak[e], held)
        if peak[ph] <= peak[idle]:
            return False
    return True


def _exit_text(out: dict[str, Any], by: dict[str, dict]) -> str:
    if "E" not in by:
        return "not run (quick)"
    gc = sum(b.get("reclaimed", 0) for b in out["kvctl_budget"].get("E gc", {})
             .get("budgets", {}).values() if b["total"] == out["budget"])
    after = by.get("E after gc", {}).get("B_peak_mib")
    return (f"A closed (SIGTERM, SIGKILL after the grace); its segment "
            f"{'gone' if (by['E'].get('A_end_mib') or 0) == 0 else 'still there'}, its budget "
            f"slot still held {_held_by(out, 'E', 'A') / MiB:g} MiB after the exit; B "
            f"{by['both']['B_peak_mib']:g} MiB in D -> {by['E']['B_peak_mib']:g} before "
            f"`kvctl budget --gc` (reclaimed {gc / MiB:g} MiB)"
            + (f" -> {after:g} after" if after is not None else ""))


def _waits(out: dict[str, Any]) -> str:
    t = out.get("ttft_ms") or {}
    if "both" not in t:
        return ""
    return "; TTFT p99 " + ", ".join(f"{e} {t[e][e]['p99']:g} ms alone -> "
                                     f"{t['both'][e]['p99']:g} ms both" for e in ("A", "B"))


def vllm_report(out: dict[str, Any]) -> tuple[LabRecord, str]:
    """The record and Markdown of two real elastic vLLMs sharing one budget."""
    from workbench.labs.kit.server_report import real_markdown, real_record

    rows = _phase_rows(out)
    checks = real_checks(out, rows)
    by = {r["phase"]: r for r in rows}
    budget = out["budget"] / MiB
    pre = {e: int(c.get("num_preemptions", 0)) for e, c in out["counters"].items()}
    done = sum(out["finished"].values())
    sent = sum(out["requests"].values())
    measured = {
        "B": f"A {by['idle']['A_peak_mib']:g} -> {by['A']['A_peak_mib']:g} MiB; B stayed at "
             f"{by['A']['B_peak_mib']:g} MiB",
        "C": f"A gave back to {by['A']['A_end_mib']:g} MiB; B peaked at "
             f"{by['B']['B_peak_mib']:g} MiB ({by['B']['B_peak_mib'] + by['A']['A_peak_mib']:g}"
             f" MiB of peaks > the {budget:g} MiB budget)",
        "D": (f"held peak {by['both']['held_peak_mib']:g} of {budget:g} MiB" + _waits(out)
              if "both" in by else "not run (quick)"),
        "E": _exit_text(out, by),
    }
    expect = []
    for ph, text, keys in EXPECT:
        if ph == "all" and "never_above_budget" in keys:
            ok = checks["never_above_budget"]
            peak = max((x["held"] for x in out["samples"] if "held" in x), default=0) / MiB
            expect.append((text, f"{'yes' if ok else 'NO'}: the budget held at most {peak:g} of "
                                 f"{budget:g} MiB over {len(out['samples'])} readings"))
        elif ph == "all":
            expect.append((text, "not visible from outside the engines (the sim counts it)"))
        else:
            keys_ok = [checks[k] for k in keys if k in checks]
            mark = "" if not keys_ok else ("yes: " if all(keys_ok) else "NO: ")
            expect.append((f"{ph}: {text}", mark + measured[ph]))
    counted = any(out["counters"].values())  # SGLang: no metrics endpoint, nothing counted
    expect.append(("no request is lost", f"{done}/{sent} finished in full" + (
        "; preemptions " + ", ".join(f"{e} {n}" for e, n in pre.items()) if counted else "")))
    expect.append(("the budget's holders are the engines' processes (kvctl budget)",
                   "yes" if checks["holders_are_the_engines"] else "NO"))
    bad = [k for k, ok in checks.items() if not ok]
    verdict = (f"supported: B mapped what A released under one {budget:g} MiB budget, never "
               "over it, no request lost" if not bad else "refuted: " + ", ".join(bad))
    top = max((x["held"] for x in out["samples"] if "held" in x), default=0) / MiB
    headline = (f"budget {budget:g} MiB: A peaked {by['A']['A_peak_mib']:g} MiB while B held "
                f"{by['A']['B_peak_mib']:g}; A gave back to {by['A']['A_end_mib']:g}, B peaked "
                f"{by['B']['B_peak_mib']:g}; held at most {top:g} MiB; {done}/{sent} finished")
    md = real_markdown("Two same-kind instances on one device", expect, rows, verdict,
                       out.get("engine", "vllm"))
    rec = real_record("same-engine-pair", out, "pages one engine frees are mapped by the other "
                      "under one shared budget that neither over-commits", verdict, headline,
                      "each engine charges every page it creates to the device's budget "
                      "segment and credits it on release; a charge past the total is a miss",
                      {"checks": checks, "preemptions": pre}, {"phases": rows})
    return rec, md
