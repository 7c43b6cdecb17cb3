"""The tp-pp lab's checks, Markdown and record (the record and figure helpers it shares with
the faults lab are :mod:`workbench.labs.kit.protocol_report`)."""

from __future__ import annotations

from typing import Any

from workbench.backends import capabilities
from workbench.labs.kit.tp_pp_workers import GEO, placement

# (check, seed 000 §11 expects (our words), how it is measured)
EXPECT = [
    ("tp_all_or_nothing", "§11.1: one logical page is mapped on every TP rank or on none",
     "a map that fails on the last rank: page 2 is mapped on no rank, each rank holds the bytes "
     "it held before, the pool goes on and the retry maps it everywhere"),
    ("local_pools", "§11.1: SGLang's local pools: each rank maps its own pages, nothing is "
     "broadcast", "an alloc in rank 0's pool changes only rank 0's device"),
    ("pp_namespaces", "§11.2: each stage has its own socket namespace",
     "stage 0 listens on w<rank>.sock, stage k on pp<k>/w<rank>.sock"),
    ("pp_every_stage", "§11.2: pp_rank = -1 maps and unmaps on every stage",
     "page 3 (pp_rank -1) on every stage, page 5 (pp_rank 0) on stage 0 only"),
    ("pp_missing_refused", "§11.2: a missing stage listener is an explicit failure, not a "
     "partial update", "TransportError before any message is sent; no stage maps anything"),
    ("async_retired", "§11.3: a page freed early is retired, not unmapped at once",
     "after the free: RETIRED and still mapped on every rank"),
    ("async_barrier", "§11.3: physical release only after every worker passed the barrier",
     "a barrier one rank does not confirm releases 0 pages (still RETIRED, mapped); the next "
     "complete barrier releases it on every rank"),
    ("round_trips", "docs/tpp.md (not the seed): map is one round trip; unmap one at TP=1 "
     "(prepare carries commit), two at TP>1 (prepare, then commit)",
     "the coordinator's round-trip counter and the requests it sent, per op"),
    ("cleanup", "§12.4 (observed here too): nothing left behind",
     "after every worker set: no socket directory, no worker process left"),
]


def checks(d: dict[str, Any]) -> dict[str, bool]:
    tp, pp, a, rt = d["tp"], d["pp"], d["async"], d["round_trips"]["rows"]
    on = lambda mapped, page: [page in v for v in mapped.values()]  # noqa: E731
    last_pp = [w for w in pp["page5_stage0_only"] if not w.startswith("pp0/")]
    return {
        "tp_all_or_nothing": tp["alloc_refused"] and not any(
            on(tp["mapped_after_failed_map"], 2)) and tp["held_before"] == tp["held_after"]
        and not tp["pool_failed"] and tp["retry_ok"] and all(on(tp["mapped_after_retry"], 2)),
        "local_pools": d["local"]["maps_after_rank0_alloc"][1:] == d["local"]["maps_before"][1:]
        and d["local"]["maps_after_rank0_alloc"][0] > d["local"]["maps_before"][0],
        "pp_namespaces": all(f.startswith("pp") == ("/" in f) for f in pp["socket_files"])
        and len({f.rsplit("/", 1)[0] for f in pp["socket_files"] if "/" in f}) == pp["pp"] - 1,
        "pp_every_stage": all(pp["page3_all_stages"].values()) and pp["page5_stage0_only"][
            "pp0/tp0"] and not any(pp["page5_stage0_only"][w] for w in last_pp),
        "pp_missing_refused": pp["missing_refused"].startswith("no listener")
        and pp["messages_sent_when_missing"] == 0
        and all(v == [] for v in pp["mapped_when_missing"].values()),
        "async_retired": a["state_after_free"] == "retired" and all(on(a["mapped_after_free"], 1)),
        "async_barrier": a["released_incomplete"] == 0 and a["state_after_incomplete"] == "retired"
        and all(on(a["mapped_after_incomplete"], 1)) and a["released_complete"] == 1
        and a["state_after_complete"] == "free" and not any(on(a["mapped_after_complete"], 1)),
        "round_trips": all(r["map_round_trips"] == [1] and r["unmap_round_trips"] == [
            1 if r["tp"] == 1 else 2] for r in rt),
        "cleanup": all(not x["socket_dir_left"] and not x["workers_left"] for x in (tp, pp, a)),
    }


def markdown(p: Any, backend: str, d: dict[str, Any], ok: dict[str, bool]) -> str:
    real = capabilities(backend).real_processes
    where = (f"real worker processes over Unix sockets, backend {backend}" if real else
             "simulated workers (SimPy, one simulated GPU each)")
    lines = [f"# TP/PP ownership on {where}", "", f"Placement: {placement(backend, p.gpus)}.", "",
             f"Seed 000 §11 (experiment 7). TP = {p.tp}, PP = {p.pp}; page ids of "
             f"{GEO.page_id_bytes >> 20} MiB per rank. Every fact below is read from the "
             "workers' own state replies and the coordinator's message log.", "",
             "| check | the seed expects | measured here | holds |", "|---|---|---|---|"]
    for key, expects, how in EXPECT:
        lines.append(f"| {key} | {expects} | {how} | {'yes' if ok[key] else '**no**'} |")
    tp = d["tp"]
    lines += ["", "## TP: a map that fails on one rank", "",
              f"Injected: the next `create` on {tp['victim']} fails. Mapped after: "
              f"{tp['mapped_after_failed_map']}; held bytes before {tp['held_before']}, after "
              f"{tp['held_after']}. Coordinator events: {'; '.join(tp['events'])}.", "",
              "## Round trips per op (first page's messages; times over every page and repeat)",
              "", "| TP | ops | map round trips | unmap round trips | unmap requests sent | "
              "map µs p50 / p90 | unmap µs p50 / p90 |", "|---|---|---|---|---|---|---|"]
    for r in d["round_trips"]["rows"]:
        lines.append(f"| {r['tp']} | {r['ops']} | {r['map_round_trips']} | "
                     f"{r['unmap_round_trips']} | {r['messages_per_unmap']} | {r['map_us_p50']} "
                     f"/ {r['map_us_p90']} | {r['unmap_us_p50']} / {r['unmap_us_p90']} |")
    clock = ("wall time in the coordinator (this host's load shows in the tail)" if real else
             "simulated time (SimPy; no randomness, so every repeat gives the same numbers)")
    lines += ["", f"Times are {clock}. TP order per repeat: {', '.join(d['round_trips']['order'])}"
              " (alternated).", "", "## Where the measurement differs from the seed", "",
              "* §11.2 lists `pp0/w0.sock`; stage 0 listens on `w<rank>.sock` here (kvcached's "
              "layout), the other stages under `pp<k>/`. The separation is the same.",
              "* §11.3's first step is a long GPU batch still reading the page. No batch runs "
              "here: the worker that does not confirm its barrier stands for it (its reply is "
              "dropped). On gpu the barrier synchronizes each rank's device.",
              "* The local-pools contrast runs on simulated devices on every backend."]
    if capabilities(backend).real_processes:
        lines.append("* Each map here creates, maps and populates a page id of real memory on "
                     "every rank (8 MiB each), so its time includes that work; docs/tpp.md's "
                     "round-trip table used simulated memory in the worker processes.")
    if not capabilities(backend).real_processes:
        lines.append("* On sim the socket layout is the rule the real transport follows; "
                     "no files exist (run `--backend host` to list real ones).")
    return "\n".join(lines) + "\n"


