"""Fault injection (seed 000 §12, experiment 8): a map failure, a prepare failure, a lost commit
reply and a killed worker process, each injected into a TP pool at one protocol step. For each:
the sequence diagram of the coordinator's real messages, the state after, what was cleaned up,
and that nothing leaked (every rank holds what it held before; no socket directory, worker
process or shared-memory entry is left).

Backends: ``sim`` (SimPy workers; a killed worker is a crash), ``host`` (worker processes with
host memory; a real SIGKILL, plus a SIGKILLed coordinator whose directory ``gc_sockets``
removes) and ``gpu`` (one process per GPU; refused when fewer GPUs than ranks are visible).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from workbench.backends import capabilities, kind
from workbench.errors import ConfigError
from workbench.labs.faults.params import FaultsParams
from workbench.labs.faults.real import CASES, coordinator_killed, run_case
from workbench.labs.faults.report import case_checks, case_row, markdown
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.protocol_report import messages_json, protocol_record, sequence_figures
from workbench.labs.kit.resolve import LabRun


def run_order(cases: tuple[str, ...], repeats: int) -> list[tuple[str, int]]:
    """Every (case, repeat), the case order reversed on every other repeat (seed 003 §2)."""
    return [(c, r) for r in range(repeats) for c in (cases if r % 2 == 0 else cases[::-1])]


def run_faults(params: FaultsParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    if params.tp < 2:
        raise ConfigError(f"tp={params.tp}", "a fault on one rank of one shows no "
                          "rollback on the others", "use tp >= 2")
    real = capabilities(run.backend).real_processes
    order = run_order(CASES, params.repeats or (1 if params.quick else 3))
    first: dict[str, dict] = {}
    found: dict[str, list[dict]] = {c: [] for c in CASES}
    for i, (case, rep) in enumerate(order):
        r = run_case(run.backend, case, params.tp, params.gpus)
        found[case].append(case_checks(r, real))
        first.setdefault(case, r)
        if progress:
            progress(i + 1, len(order), f"{case} #{rep}")
    data: dict[str, Any] = {"order": [f"{c}/{r}" for c, r in order], "first": first,
                            "rows": [case_row(first[c]) for c in CASES]}
    if real and params.coordinator_kill:
        data["coordinator_killed"] = coordinator_killed(kind(run.backend))
    figs = sequence_figures({f"seq_{c}": (f"{c}: {first[c]['fault']}", first[c]["messages"])
                             for c in CASES})
    md = markdown(params, run.backend, data, found)
    checks = [dict(c, case=case, repeat=i) for case, cs in found.items()
              for i, c in enumerate(cs)]
    tables = {"cases": data["rows"], "checks": checks}
    return LabResult(FaultsLab._record(params, run.backend, data, found), md, tables, figs)


class FaultsLab(Lab):
    name = "faults"
    description = ("map failure, prepare failure, a lost commit reply, a killed process: the "
                   "sequence, the state after, the cleanup, nothing leaked (seed 000 §12)")
    params_type = FaultsParams
    runners = {"simulated": run_faults, "mini": run_faults}  # real processes on host/gpu
    ranks = staticmethod(lambda p: p.tp)

    @staticmethod
    def _record(p: FaultsParams, backend: str, data: dict, found: dict[str, list[dict]]):
        kc = data.get("coordinator_killed")
        ok = all(all(c.values()) for cs in found.values() for c in cs) and (
            kc is None or (kc["gc_removed_it"] and not kc["dir_after_gc"]))
        plain = {c: {k: v for k, v in r.items() if k != "messages"}
                 for c, r in data["first"].items()}
        return protocol_record(
            gpus=p.gpus, lab="faults", backend=backend,
            hypothesis="after each injected fault every page is mapped on every rank or none "
                       "(or the pool failed loudly), the faulty step is undone, and nothing "
                       "is leaked",
            samples={"order": data["order"], "cases": list(CASES)},
            outcomes={c: [all(x.values()) for x in cs] for c, cs in found.items()},
            kv={"checks": {c: cs for c, cs in found.items()}}, verdict_ok=ok,
            mechanism="map rolls back exactly what each rank newly mapped; unmap is "
                      "prepare/commit with abort everywhere; commit is idempotent and retried; "
                      "an unknown outcome fails the pool; the group removes what SIGKILL left",
            open_questions=["a lost commit reply twice in a row fails the pool "
                            "(state_consistency_unknown): covered by tests/tpp, not shown here"],
            applicability=f"one TP {p.tp} pool, 8 MiB page ids, backend {backend}",
            results={"cases": plain, "rows": data["rows"], "coordinator_killed": kc,
                     "messages": {c: messages_json(r["messages"])
                                  for c, r in data["first"].items()}, "params": asdict(p)},
            engine_config={"tp": p.tp, "pp": 1, "coordinator": "FanOutSpace"})
