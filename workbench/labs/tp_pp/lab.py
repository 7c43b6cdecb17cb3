"""TP/PP (seed 000 §11, experiment 7): one page decision applied on every worker that owns a copy
of the KV range, measured on the workers themselves.

* TP: a map that fails on one rank leaves no rank mapped (the others undo what they newly
  mapped), against SGLang-style local pools where nothing is broadcast;
* PP: each stage has its own socket namespace; ``pp_rank = -1`` covers every stage, a missing
  stage listener is refused before anything is sent;
* async release: a freed page stays RETIRED, mapped on every rank, until every worker confirmed
  the barrier for its epoch;
* round trips per op: map 1; unmap 1 at TP=1 (folded), 2 at TP=2 (prepare + commit), repeated
  with the TP order alternated (seed 003 §2).

Backends: ``sim`` (SimPy workers), ``host`` (one OS process per rank, host memory) and ``gpu``
(one process per rank, one CUDA GPU each: refused when fewer GPUs than ranks are visible).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from workbench.errors import ConfigError
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.protocol_report import messages_json, protocol_record, sequence_figures
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.tp_pp_workers import GEO
from workbench.labs.tp_pp.params import TpPpParams
from workbench.labs.tp_pp.real import (
    async_release,
    local_pools_contrast,
    pp_namespaces,
    round_trips,
    tp_all_or_nothing,
)
from workbench.labs.tp_pp.report import checks, markdown


def run_tp_pp(params: TpPpParams, run: LabRun,
              progress: Progress | None = None) -> LabResult:
    if params.tp < 2 or params.pp < 2:
        raise ConfigError(f"tp={params.tp}, pp={params.pp}", "the lab needs two ranks or "
                          "more to show anything", "use tp >= 2 and pp >= 2")
    pages = params.pages or (8 if params.quick else 14)
    repeats = params.repeats or (2 if params.quick else 6)
    if not 1 <= pages < GEO.num_pages:  # each pass maps page ids 1..pages
        raise ConfigError(f"pages={pages}", f"the lab's pool has page ids 0.."
                          f"{GEO.num_pages - 1}, and the round trips use ids from 1",
                          f"use 1 to {GEO.num_pages - 1} pages")
    g = params.gpus
    steps = [("tp", lambda: tp_all_or_nothing(run.backend, params.tp, g)),
             ("local", lambda: local_pools_contrast(params.tp)),
             ("pp", lambda: pp_namespaces(run.backend, params.pp, g)),
             ("async", lambda: async_release(run.backend, params.tp, g)),
             ("round_trips", lambda: round_trips(run.backend, (1, params.tp), pages, repeats,
                                                 g))]
    data: dict[str, Any] = {}
    for i, (key, step) in enumerate(steps):
        data[key] = step()
        if progress:
            progress(i + 1, len(steps), key)
    ok = checks(data)
    figs = sequence_figures({
        "seq_tp_map_failure": (f"TP={params.tp}: a map fails on {data['tp']['victim']}",
                               data["tp"]["messages"]),
        "seq_async_barrier": ("async release: an incomplete barrier, then a complete one",
                              data["async"]["messages_incomplete"]
                              + data["async"]["messages_complete"]),
        "seq_unmap_tp": (f"TP={params.tp}: map, then unmap as prepare + commit",
                         data["round_trips"]["messages"][params.tp])})
    rows = data["round_trips"]["rows"]
    md = markdown(params, run.backend, data, ok)
    tables = {"checks": [{"check": k, "holds": v} for k, v in ok.items()],
              "round_trips": rows}
    return LabResult(TpPpLab._record(params, run.backend, data, ok), md, tables, figs)


class TpPpLab(Lab):
    name = "tp-pp"
    description = ("TP maps all-or-nothing, PP stage namespaces, the async release barrier, "
                   "round trips per op; simulated workers or real processes (seed 000 §11)")
    params_type = TpPpParams
    runners = {"simulated": run_tp_pp, "mini": run_tp_pp}  # real processes on host/gpu
    ranks = staticmethod(lambda p: p.ranks())

    @staticmethod
    def _record(p: TpPpParams, backend: str, d: dict, ok: dict[str, bool]):
        logs = ("messages", "messages_incomplete", "messages_complete")  # drawn, kept below
        plain = {k: {kk: vv for kk, vv in v.items() if kk not in logs}
                 for k, v in d.items() if isinstance(v, dict)}
        msgs = {"tp_map_failure": messages_json(d["tp"]["messages"]),
                "async_barrier": messages_json(d["async"]["messages_incomplete"]
                                               + d["async"]["messages_complete"]),
                "unmap": {str(tp): messages_json(m)
                          for tp, m in d["round_trips"]["messages"].items()}}
        return protocol_record(
            gpus=p.gpus, lab="tp-pp", backend=backend,
            hypothesis="a page is mapped on every TP rank and PP stage or on none; stages are "
                       "separate namespaces; a retired page is released only after every "
                       "worker's barrier",
            samples={"round_trip_order": d["round_trips"]["order"],
                     "pages_per_repeat": p.pages or (8 if p.quick else 14)},
            outcomes={"checks_passed": sum(ok.values()), "checks": len(ok)},
            kv={"checks": ok}, verdict_ok=all(ok.values()),
            mechanism="the coordinator sends every page decision to every target and undoes "
                      "a partial map; unmap is prepare/commit; deferred pages wait for a "
                      "barrier every target confirms",
            open_questions=["no real engine batch holds a retired page here: the unconfirmed "
                            "barrier stands for it"],
            applicability=f"one pool, TP {p.tp} / PP {p.pp}, 8 MiB page ids, backend {backend}",
            results=plain | {"messages": msgs, "params": asdict(p)},
            engine_config={"tp": p.tp, "pp": p.pp, "coordinator": "FanOutSpace"})
