"""The faults lab's checks and Markdown (:mod:`workbench.labs.faults.lab`)."""

from __future__ import annotations

from typing import Any

from workbench.backends import capabilities
from workbench.labs.kit.tp_pp_workers import placement
from workbench.units import MiB

# case -> (what the workbench expects (seed 001 §8 and the fault matrix; seed 000 §12 names the
# faults and what to observe but leaves the expected outcomes blank), the checks that say so)
EXPECT = {
    "map-failure": "the ranks that mapped undo exactly what they newly mapped; the alloc misses; "
                   "the pool goes on",
    "prepare-failure": "abort on every rank restores the mapping; the page stays mapped "
                       "(parked); the pool goes on",
    "lost-commit-reply": "the commit is retried where unconfirmed (it is idempotent); the page "
                         "is released on every rank; the pool goes on",
    "killed-process": "the outcome on the dead rank is unknown: the pool fails loudly, the "
                      "survivors undo the new page, other instances stay healthy; SIGKILL runs "
                      "no cleanup, so the group (or `gc_sockets`) removes what it left",
}


def _live(d: dict) -> dict[str, int]:
    return {w: h for w, h in d["held"].items() if h is not None}


def case_checks(r: dict[str, Any], real: bool) -> dict[str, bool]:
    """What must hold after one case (every value read from the workers)."""
    before, after, start, end = r["before"], r["after"], r["start"], r["end"]
    snaps = (start, before, after, end)
    live_after = {w: m for w, m in after["mapped"].items() if after["held"][w] is not None}
    out = {
        "all_or_none": len({tuple(m) for m in live_after.values()}) == 1,
        # held minus what is mapped: 0 on sim and host, a CUDA worker's zero piece on gpu;
        # it never moves, or a handle is held without a mapping (or a mapping not counted)
        "no_unbacked_bytes": all(v in (start["unbacked"][w], None) for s in snaps
                                 for w, v in s["unbacked"].items()),
        "nothing_left": not r["after_shutdown"]["socket_dir_left"]
        and not r["after_shutdown"]["workers_left"] and r["shm_left"] == [],
    }
    case, ranks = r["case"], len(before["mapped"])
    undo = r["cleaned_up"]
    if case == "map-failure":
        out["rolled_back"] = r["result"] == "refused (None)" and after["held"] == before[
            "held"] and after["page2"] == "free" and len(undo) == ranks - 1 and all(
            u.endswith("UNMAP page 2") for u in undo)
    elif case == "prepare-failure":
        out["aborted"] = after["held"] == before["held"] and after["page1"] == "reserved" and \
            sum(u.split(": ", 1)[1].startswith("ABORT") for u in undo) == ranks
    elif case == "lost-commit-reply":
        out["committed"] = after["page1"] == "free" and after["held"] == start["held"] and \
            undo == [f"coordinator -> {r['victim'].replace('tp', 'w')}: COMMIT sent 2 times "
                     "(retried)"]
    else:
        survivors = _live(after)
        out["pool_failed"] = r["result"] == "StateConsistencyError" and bool(after["pool_failed"])
        out["survivors_rolled_back"] = survivors == {w: before["held"][w] for w in survivors} \
            and after["held"][r["victim"]] is None
        out["other_instance_healthy"] = r["other_instance_ok"]
        if real:
            out["sigkill_left_its_socket"] = r["victim_exit_code"] == -9 and r[
                "victim_socket_left"]
    if case != "killed-process":
        out["pool_goes_on"] = not after["pool_failed"]
        out["returns_to_start"] = end["held"] == start["held"] and end["mapped"] == start[
            "mapped"]
    return out


def _held(s: dict) -> str:
    return ", ".join(f"{w} {'gone' if h is None else f'{h / MiB:g} MiB'}"
                     for w, h in s["held"].items())


def case_row(r: dict[str, Any]) -> dict[str, Any]:
    a = r["after"]
    return {"case": r["case"], "fault": r["fault"], "operation": r["op"], "result": r["result"],
            "page 1 / page 2 after": f"{a['page1']} / {a['page2']}",
            "pool": f"failed: {a['pool_failed']}" if a["pool_failed"] else "ok",
            "mapped after": a["mapped"], "held before": _held(r["before"]),
            "held after": _held(a), "held at the end": _held(r["end"]),
            "cleaned up": "; ".join(r["cleaned_up"] + [r["pool_cleanup"]]),
            "left after shutdown": "nothing" if not r["after_shutdown"]["socket_dir_left"]
            and not r["after_shutdown"]["workers_left"] and not r["shm_left"] else
            str(r["after_shutdown"] | {"shm": r["shm_left"]})}


def markdown(p: Any, backend: str, data: dict[str, Any], found: dict[str, list[dict]]) -> str:
    real = capabilities(backend).real_processes
    where = (f"real worker processes over Unix sockets ({backend})" if real else
             "simulated workers (SimPy; a killed worker is a crash that frees its memory)")
    n = len(data["order"]) // len(found)
    lines = [f"# Fault injection on {where}", "", f"Placement: {placement(backend, p.gpus)}.", "",
             f"Seed 000 §12 (experiment 8). TP = {p.tp}; each case {n} time(s), the case order "
             f"reversed on every other repeat ({', '.join(data['order'])}). Seed 000 §12 names "
             "the four faults and what to watch (/dev/shm, the socket directory, device memory, "
             "the other instances) but leaves its expected outcomes blank; the expectations "
             "below come from seed 001 §8's state machine (abort restores the mapping, any "
             "uncertainty quarantines the page or fails the pool) and the fault matrix of "
             "docs/tpp.md.", "",
             "| case | expected | measured | checks that hold (every repeat) |",
             "|---|---|---|---|"]
    for case, runs in found.items():
        keys = list(runs[0])
        holds = [k for k in keys if all(c[k] for c in runs)]
        bad = [k for k in keys if k not in holds]
        row = data["first"][case]
        lines.append(f"| {case} | {EXPECT[case]} | {row['result']}; after: page 1 "
                     f"{row['after']['page1']}, page 2 {row['after']['page2']}"
                     f"{', pool failed' if row['after']['pool_failed'] else ''} | "
                     f"{', '.join(holds)}{' — **not**: ' + ', '.join(bad) if bad else ''} |")
    lines += ["", "## What each case cleaned up, and what it left", "",
              "| case | cleaned up | held before the fault | held after | at the end | "
              "left after shutdown |", "|---|---|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['case']} | {row['cleaned up']} | {row['held before']} | "
                     f"{row['held after']} | {row['held at the end']} | "
                     f"{row['left after shutdown']} |")
    kc = data.get("coordinator_killed")
    if kc:
        lines += ["", "## A SIGKILLed coordinator", "",
                  f"Its directory was still there after the kill ({kc['dir_after_kill']}); its "
                  f"workers noticed the parent was gone and left ({kc['workers_left_sockets']} "
                  f"sockets remained); `gc_sockets` removed the directory "
                  f"({kc['gc_removed_it']}; present afterwards: {kc['dir_after_gc']})."]
    lines += ["", "## Where the measurement differs from the seed", "",
              "* \"Held\" is what each rank's device holds: the simulated GPU's allocations, "
              "the host worker's committed memfd pages (its capacity minus its free figure), "
              "the CUDA worker's own handles (with its one zero piece, taken by a warm-up map and "
              "unmap before the start, so held minus mapped stays constant). It never counts "
              "the driver's own structures.",
              "* The workers create no /dev/shm entries at all (memfd pages have no name); the "
              "check counts workbench entries owned by this run's processes."]
    if not capabilities(backend).real_processes:
        lines.append("* On sim a killed worker is `SimCluster.crash`: no process, no socket "
                     "file; run `--backend host` for a real SIGKILL.")
    return "\n".join(lines) + "\n"
