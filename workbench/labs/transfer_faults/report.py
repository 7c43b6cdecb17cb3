"""The transfer-faults lab's table, Markdown, record and figures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.labs.kit.record import LabRecord, Manifest
from workbench.pd.faults import FaultCase

if TYPE_CHECKING:
    from workbench.labs.transfer_faults.params import TransferFaultsParams


SEED_EXPECTED = (
    "Seed 003 E8 lists seven faults, each with what to observe and a correctness criterion, "
    "to be injected through test interfaces in an isolated setup rather than by corrupting "
    "memory at random; it asks for recovery time, leftover blocks, failed requests, recompute "
    "and any new load peak, and for at least one fault -> state change -> cleanup -> fallback "
    "sequence with its log evidence.")


def row_table(cases: list[tuple[FaultCase, FaultCase | None]]) -> list[dict[str, Any]]:
    return [{"row": c.name, "fault": c.fault, "observe": c.observe, "criterion": c.criterion,
             "passed": c.passed, "checks": c.checks, "state": c.state,
             "unsafe_failed": None if u is None else sorted(k for k, ok in u.checks.items()
                                                            if not ok),
             "messages": [s._asdict() for s in c.steps]} for c, u in cases]


def markdown(table: list[dict]) -> str:
    md = ["# Cache and transfer faults (simulated transfer path)", "",
          "## Seed's expected result", "", SEED_EXPECTED, "", "## Measured", "",
          "| fault | criterion | holds | without the guard, fails | state after |",
          "|---|---|---|---|---|"]
    for r in table:
        unsafe = "not run" if r["unsafe_failed"] is None else \
            (", ".join(r["unsafe_failed"]) or "nothing (guard not needed here)")
        state = ", ".join(f"{k}={v}" for k, v in r["state"].items())
        md.append(f"| {r['fault']} | {r['criterion']} | {'yes' if r['passed'] else '**no**'} "
                  f"| {unsafe} | {state} |")
    md += ["", "## What differs from a real system", "",
           "* The state machine is the workbench's own model of a connector and a store, not "
           "LMCache's or Mooncake's code: its guards (deferred free, leases, generations, "
           "namespaced keys, visibility after completion) are generic, and how a real system "
           "implements each must be checked in its version's code.",
           "* Faults are injected at exact protocol steps (the seed's advice); timing races a "
           "real system would hit at random are forced here, once each.",
           "* KV content is a hash of namespace and token prefix, so 'output unchanged' means "
           "every KV slot the model reads is the one a full prefill would compute."]
    return "\n".join(md) + "\n"


def record(params: TransferFaultsParams, table: list[dict], backend: str) -> LabRecord:
    held = all(r["passed"] for r in table)
    by = {r["row"]: r for r in table}
    return LabRecord(
        experiment_id="transfer-faults-seven-rows",
        hypothesis="each fault row's correctness criterion holds with its guard and fails "
                   "without it",
        environment={"backend": backend, "command": "workbench labs run transfer-faults"},
        model_io={"prompt_tokens": 16, "block_tokens": 4, "model": "hash stand-in"},
        cache_state="store warmed per row as the row needs",
        load={"requests": "one or two per row; store-slow: 8 at once"},
        samples={"rows": list(by), "repeats": 1, "order": "the seed's order (deterministic)"},
        outcomes={k: r["passed"] for k, r in by.items()}, ttft={}, tpot_itl={}, e2e={},
        throughput={}, slo_goodput={}, hits={k: r["state"].get("hit_tokens") for k, r in
                                             by.items() if "hit_tokens" in r["state"]},
        transfer_bytes=None, phase_times=None,
        kv={k: r["state"] for k, r in by.items()},
        correctness="; ".join(f"{k}: {'holds' if r['passed'] else 'FAILS'}"
                              for k, r in by.items()),
        raw_data={"messages": {k: r["messages"] for k, r in by.items()}},
        verdict=("supported: " if held else "not supported: ") +
        f"{sum(r['passed'] for r in table)}/{len(table)} criteria hold with their guards",
        mechanism="deferred free of busy blocks, leases, generations, namespaced keys, "
                  "visibility after completion, timeouts with a bounded fallback",
        open_questions=["timing races at random points", "a real store's retry policy"],
        applicability="the workbench's simulated transfer path",
        manifest=Manifest.collect(hardware={"gpu": "none (logical model)"},
                                  engine_config={"block_size": 4},
                                  kvcached_config={}, backend=backend),
        results={"rows": table})


def figures(cases: list[tuple[FaultCase, FaultCase | None]]) -> dict[str, Any]:
    try:
        from workbench.viz.phased import phased_sequence_figure
    except ImportError:
        return {}
    return {c.name: phased_sequence_figure(c.steps, title=f"{c.fault}: {c.criterion}")
            for c, _ in cases}
