"""The protocol labs' record and sequence figures (tp-pp, faults): they measure the
page protocol between coordinator and workers, not request latency."""

from __future__ import annotations

from typing import Any

from workbench.labs.kit.record import LabRecord, Manifest
from workbench.labs.kit.tp_pp_workers import GEO, placement

NOT_MEASURED = {"not_measured": "a protocol lab: no requests are served"}


def protocol_record(*, lab: str, backend: str, hypothesis: str, samples: dict,
                    outcomes: dict, kv: dict, verdict_ok: bool, mechanism: str,
                    open_questions: list[str], applicability: str, results: dict,
                    engine_config: dict, gpus: int | None = None) -> LabRecord:
    """A LabRecord for a protocol lab: the latency fields say they were not measured."""
    return LabRecord(
        experiment_id=f"{lab}-{backend}", hypothesis=hypothesis,
        environment={"backend": backend, "command": f"workbench labs run {lab} --backend "
                     f"{backend}"},
        model_io={"geometry": {"num_layers": GEO.num_layers, "kv_heads": GEO.kv_heads,
                               "head_dim": GEO.head_dim, "page_id_bytes": GEO.page_id_bytes}},
        cache_state="no prefix cache; pages mapped on demand (no reserve, no prealloc)",
        load={"ops": "page map/unmap driven directly through the pool"}, samples=samples,
        outcomes=outcomes, ttft=NOT_MEASURED, tpot_itl=NOT_MEASURED, e2e=NOT_MEASURED,
        throughput=NOT_MEASURED, slo_goodput=NOT_MEASURED, hits=NOT_MEASURED,
        transfer_bytes=None, phase_times=None, kv=kv, correctness=None,
        raw_data={"messages": "results.messages (the coordinator's log)"},
        verdict="supported" if verdict_ok else "refuted: see kv checks",
        mechanism=mechanism, open_questions=open_questions, applicability=applicability,
        manifest=Manifest.collect(
            hardware={"device": placement(backend, gpus)},
            engine_config=engine_config,
            kvcached_config={"page_size": GEO.page_size, "prealloc": False,
                             "min_reserved_pages": 0, "max_reserved_pages": 0},
            backend=backend),
        results=results)


def sequence_figures(named: dict[str, tuple[str, list]]) -> dict[str, Any]:
    """``name -> (title, messages)`` drawn as sequence diagrams; {} without plotly."""
    try:
        from workbench.viz.sequence import sequence_figure
    except ImportError:
        return {}
    return {k: sequence_figure(msgs, title=title) for k, (title, msgs) in named.items() if msgs}


def messages_json(msgs: list) -> list[dict[str, Any]]:
    return [{"src": m.src, "dst": m.dst, "label": m.label, "t": m.t, "ok": m.ok} for m in msgs]
