"""The dynamic-limit lab's tables, record, Markdown and figures, from
:func:`workbench.labs.dynamic_limit.sim.run_seed`'s runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.labs.dynamic_limit.sim import DEVICE_GIB, MODEL
from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.server_report import kind_of, real_markdown, real_record
from workbench.units import GiB, MiB

if TYPE_CHECKING:
    from workbench.labs.dynamic_limit.params import DynamicLimitParams

# what each request of the schedule must be answered (the CLI's answer, then the final one)
EXPECTED = {"tighten": ("acknowledged", "acknowledged"),
            "race: first": ("superseded", "superseded"),
            "race: second": ("acknowledged", "acknowledged"),
            "conflict: remote": ("refused", "refused"),
            "release": ("pending", "acknowledged")}


COUNTED = {"vllm"}  # the kinds whose preemptions the engine counts (0 when none is reported)

def epochs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per limit in force (a revision change seen in the samples): when it was seen,
    whether it shrank the pool, and when mapped memory first fit under it (not shrinking)."""
    out, s = [], run["samples"]
    for i, x in enumerate(s):
        if i == 0 or x["revision"] == s[i - 1]["revision"]:
            continue
        later = [y for y in s[i:] if y["revision"] == x["revision"]]
        fit = next((y for y in later if y["mapped"] <= y["limit"] and not y["shrinking"]), None)
        out.append({"seed": run["seed"], "revision": x["revision"], "limit_gib":
                    round(x["limit"] / GiB, 3), "seen_t": x["t"],
                    "mapped_before_gib": round(s[i - 1]["mapped"] / GiB, 3),
                    "shrinks": s[i - 1]["mapped"] > x["limit"],
                    "converged_t": fit and fit["t"],
                    "converge_s": fit and round(fit["t"] - s[i - 1]["t"], 3)})
    return out


def tables(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    reqs = [{"seed": r["seed"], "action": q["action"], "t": q["t"],
             "requested_gib": round(q["requested"] / GiB, 3), "revision": q["revision"],
             "request_id": q["request_id"], "cli_answer": q["answer"], "exit": q["exit"],
             "outcome": q["outcome"], "final_answer": q["resolved"],
             "superseded_by": q["superseded_by"] and q["superseded_by"]["request_id"],
             "expected": "/".join(EXPECTED[q["action"]])} for r in runs for q in r["requests"]]
    outcome = [{"seed": r["seed"], "submitted": r["submitted"], "finished": r["finished"],
                "rejected": r["summary"]["rejected"],
                "misses": r["samples"][-1]["misses"],
                "preemptions": r["samples"][-1]["preemptions"],
                "ttft_p50_ms": round(r["summary"]["ttft"]["p50"] * 1e3, 1),
                "ttft_p99_ms": round(r["summary"]["ttft"]["p99"] * 1e3, 1),
                "unmaps": r["unmaps"], "live_unmaps": len(r["live_unmaps"]),
                "segment_left": r["segment_left"]} for r in runs]
    return {"requests": reqs, "epochs": [e for r in runs for e in epochs(r)],
            "outcomes": outcome}


def checks(runs: list[dict[str, Any]], tabs: dict[str, list]) -> dict[str, bool]:
    revs = [[q["revision"] for q in r["requests"]] for r in runs]
    return {
        "answers as expected": all((q["cli_answer"], q["final_answer"]) ==
                                   EXPECTED[q["action"]] for q in tabs["requests"]),
        "revisions increase": all(v == sorted(set(v)) for v in revs),
        "every shrink converged": all(e["converged_t"] is not None for e in tabs["epochs"]
                                      if e["shrinks"]),
        "no request killed": all(o["finished"] == o["submitted"] and o["rejected"] == 0
                                 for o in tabs["outcomes"]),
        "no live page freed": all(o["live_unmaps"] == 0 and o["unmaps"] > 0
                                  for o in tabs["outcomes"]),
        "misses instead of crashes": all(o["misses"] > 0 for o in tabs["outcomes"]),
    }


def _verdict(runs: list[dict[str, Any]], tabs: dict[str, list]) -> str:
    bad = [k for k, ok in checks(runs, tabs).items() if not ok]
    if bad:
        return "Refuted in simulation: " + ", ".join(bad)
    conv = [e["converge_s"] for e in tabs["epochs"] if e["shrinks"]]
    return (f"Supported in simulation: every shrink converged ({min(conv):g}-{max(conv):g} s "
            "after the owner saw it), every request finished, pressure showed as allocation "
            "misses and preemptions, each request got its own answer")


def markdown(runs: list[dict[str, Any]], tabs: dict[str, list], p: DynamicLimitParams) -> str:
    lines = ["# Dynamic memory limit (simulated engine, real `kvctl limit`)", "",
             f"A vLLM-like {MODEL} on a simulated {DEVICE_GIB:g} GiB device, Poisson {p.rate:g} "
             f"req/s ({p.prompt_len}/{p.output_len} tokens), its pool published as a control "
             f"segment. This process steps simulated time in {p.chunk_s:g} s chunks and starts "
             "each `workbench kvctl limit NAME BYTES --json` subprocess between two chunks, "
             "stepping on once the request is written; the owner applies it on its next "
             "allocation or free. Limits are fractions of what was mapped at the first request.",
             "", "**Expected (seed 000 §10.2)**: the revision rises, the pool enters a shrink "
             "state, new allocations avoid the retired tail, live and cached blocks drain, empty "
             "and reserved pages unmap, and the capacity converges to the target. A limit kills "
             "no running request and frees no live page; how fast it converges depends on the "
             "traffic. Each remote request gets its own answer.", "",
             "## Requests (by id)", "",
             "| seed | t (s) | action | GiB | revision | request id | kvctl said (exit) | "
             "outcome | final | expected |", "|---|---|---|---|---|---|---|---|---|---|"]
    for q in tabs["requests"]:
        by = f" by {q['superseded_by']}" if q["superseded_by"] else ""
        lines.append(f"| {q['seed']} | {q['t']:g} | {q['action']} | {q['requested_gib']:g} | "
                     f"{q['revision']} | `{q['request_id']}` | {q['cli_answer']}{by} "
                     f"({q['exit']}) | {q['outcome']} | {q['final_answer']} | {q['expected']} |")
    for r in runs:
        ip = r["in_process_limit"]
        lines.append(f"\nSeed {r['seed']}: the owner's own `set_limit` at t={ip['t']:g} s took "
                     f"revision {ip['revision']} ({ip['outcome']}, {ip['limit'] / GiB:.3f} GiB) "
                     "after the remote request had been written with that same revision.")
    lines += ["", "## Convergence (each limit the owner put in force)", "",
              "| seed | revision | limit GiB | mapped before GiB | shrinks | seen at (s) | "
              "converged at (s) | converge s |", "|---|---|---|---|---|---|---|---|"]
    for e in tabs["epochs"]:
        lines.append(f"| {e['seed']} | {e['revision']} | {e['limit_gib']} | "
                     f"{e['mapped_before_gib']} | {e['shrinks']} | {e['seen_t']} | "
                     f"{e['converged_t']} | {e['converge_s']} |")
    lines += ["", "## Requests served", "", "| seed | finished / submitted | rejected | "
              "allocation misses | preemptions | TTFT p50 / p99 ms | unmaps (of live pages) | "
              "segment left |", "|---|---|---|---|---|---|---|---|"]
    for o in tabs["outcomes"]:
        lines.append(f"| {o['seed']} | {o['finished']} / {o['submitted']} | {o['rejected']} | "
                     f"{o['misses']} | {o['preemptions']} | {o['ttft_p50_ms']} / "
                     f"{o['ttft_p99_ms']} | {o['unmaps']} ({o['live_unmaps']}) | "
                     f"{o['segment_left']} |")
    lines += ["", "## Checks", ""]
    lines += [f"* {k}: {'yes' if ok else 'NO'}" for k, ok in checks(runs, tabs).items()]
    lines += ["", f"**Verdict**: {_verdict(runs, tabs)}.", "", NOTES]
    return "\n".join(lines) + "\n"


NOTES = """## Reading the differences

* *Converge s* counts from the last sample before the owner saw the limit, in simulated time at
  the chunk's resolution. It is about one request lifetime here (256 output tokens at ~10 ms a
  step): the retired tail empties only as the requests holding blocks there finish or are
  preempted; the limit itself frees no live page (*unmaps of live pages* stays 0). Longer
  requests, a prefix cache or fragmentation make it slower (seed 000 §10.2).
* The *conflict* row is a race the seed does not name: an owner-side limit and a remote one
  picking the same revision. The workbench refuses the remote one (`conflict`) rather than let
  two different limits share a revision.
* The *release* was sent with `--wait 0`: kvctl answered `pending` and exited; its final answer
  is read off the segment after the owner applied it, by the same rule the CLI uses."""


def record(runs: list[dict[str, Any]], tabs: dict[str, list], p: DynamicLimitParams,
           backend: str) -> LabRecord:
    def per(key: str) -> dict[str, Any]:
        return {str(r["seed"]): r["summary"][key] for r in runs}

    return LabRecord(
        experiment_id="dynamic-limit", hypothesis="a limit set from another process while "
        "traffic runs converges through a revisioned shrink without killing a request",
        environment={"backend": backend, "chunk_s": p.chunk_s},
        model_io={"model": MODEL, "prompt_len": p.prompt_len, "output_len": p.output_len},
        cache_state="prefix caching off", load={"arrival": f"Poisson {p.rate:g} req/s"},
        samples={"seeds": [r["seed"] for r in runs], "schedule": list(EXPECTED)},
        outcomes={"rows": tabs["outcomes"]}, ttft=per("ttft"), tpot_itl=per("tpot"),
        e2e=per("e2e"), throughput=per("output_tok_per_s"), slo_goodput={}, hits={},
        transfer_bytes=None, phase_times=None,
        kv={"epochs": tabs["epochs"], "in_process": [r["in_process_limit"] for r in runs]},
        correctness=None, raw_data={}, verdict=_verdict(runs, tabs),
        mechanism="the owner polls its segment on every allocation and free; a smaller limit "
                  "retires the tail pages, allocations miss there, the scheduler preempts and "
                  "queues, pages unmap as their blocks drain",
        open_questions=["a real engine's resize watcher polls on a timer, not only on alloc"],
        applicability="one elastic instance under steady load",
        manifest=Manifest.collect(
            hardware={"gpu": f"simulated {DEVICE_GIB:g} GiB device (h200 latencies)"},
            engine_config={"engine": "vllm-like (sim)", "model": MODEL, "block_size": 16},
            kvcached_config={"ipc_name": "per run", "prealloc": True}, backend=backend),
        results=tabs)


def figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mapped bytes and the limit over time (first seed), the requests marked; {} w/o plotly."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        return {}
    r = runs[0]
    t = [x["t"] for x in r["samples"]]
    fig = go.Figure()
    fig.add_scatter(x=t, y=[x["mapped"] / GiB for x in r["samples"]], name="mapped")
    fig.add_scatter(x=t, y=[min(x["limit"], r["base_mapped"] * 1.5) / GiB
                            for x in r["samples"]], name="limit (capped for the plot)",
                    line={"dash": "dash"})
    for q in r["requests"]:
        fig.add_vline(x=q["t"], line_dash="dot", annotation_text=q["action"])
    fig.update_layout(xaxis_title="simulated time (s)", yaxis_title="GiB")
    q = go.Figure()
    for k in ("running", "waiting", "preemptions"):
        q.add_scatter(x=t, y=[x[k] for x in r["samples"]], name=k)
    q.update_layout(xaxis_title="simulated time (s)", yaxis_title="requests")
    return {"memory": fig, "queue": q}


def _flush_row(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """SGLang's last step: a limit the radix cache defers, then ``/flush_cache``."""
    f = next((s for s in steps if s["step"] == "flush the radix cache"), None)
    if f is None:
        return []
    flush = f.get("flush") or {}
    settled = (f.get("mapped_settled") or 0) / MiB
    return [("a limit never takes what the cache owns; flushing the cache lets it converge",
             f"limit {f['requested'] / MiB:.0f} MiB {f.get('answer')} ({f.get('outcome')}); "
             f"/flush_cache {'ok' if flush.get('ok') else 'refused: ' + str(flush)}; "
             f"mapped {f['mapped_before'] / MiB:.0f} -> {settled:.0f} MiB")]


def vllm_report(out: dict[str, Any]) -> tuple[LabRecord, str]:
    """The record and Markdown of a run on a real vLLM or SGLang (:mod:`.server`'s rows)."""
    steps = out["steps"]
    answers = sorted({s.get("answer", "?") for s in steps})
    page = out["page_id_bytes"]
    halve = next(s for s in steps if s["step"] == "halve")
    freed = (halve["mapped_before"] - (halve.get("mapped_settled") or 0))
    moved = (halve.get("free_after") or 0) - halve["free_before"]
    lost = out["requests"] - out["finished"]
    ok = lost == 0 and halve.get("answer") == "acknowledged"
    verdict = ("supported: the limit was acknowledged mid-run and no request was lost" if ok
               else f"refuted: {lost} requests lost; first answer {halve.get('answer')}")
    settled = (halve.get("mapped_settled") or 0) / MiB
    counted = out.get("counters") or {}
    pre = (f", {int(counted.get('num_preemptions', 0))} preemptions" if counted or
           kind_of(out) in COUNTED else "")
    headline = (f"limit {halve['requested'] / MiB:.0f} MiB {halve.get('answer')} "
                f"({halve.get('outcome')}); mapped {halve['mapped_before'] / MiB:.0f} -> "
                f"{settled:.0f} MiB; {out['finished']}/{out['requests']} finished{pre}; "
                f"device free moved {moved / MiB:+.0f} MiB")
    md = real_markdown("Dynamic limit", [
        ("a limit from another process is answered", ", ".join(answers)),
        ("no request is lost", f"{out['finished']}/{out['requests']} finished in full"),
        ("device free memory moves by the pages freed",
         f"pages freed {freed / MiB:.0f} MiB ({freed // page if page else 0} page ids), "
         f"device free moved {moved / MiB:+.0f} MiB"
         + (" (host MemAvailable: other processes move it too)" if out["device"] == "cpu"
            else "")),
        ("a superseded request says by which", next((s.get("answer", "") for s in steps
                                                   if s["step"] == "two writers"), "-")),
        *_flush_row(steps),
    ], [{k: s.get(k) for k in ("step", "requested", "answer", "outcome", "mapped_before",
                                "mapped_settled", "s")} for s in steps], verdict, kind_of(out))
    rec = real_record("dynamic-limit", out, "a limit set mid-run is applied without losing work",
                  verdict, headline, "the pool applies the segment's request on its next "
                  "allocation or free and unmaps emptied pages", {"page_id_bytes": page},
                  {"steps": steps})
    return rec, md
