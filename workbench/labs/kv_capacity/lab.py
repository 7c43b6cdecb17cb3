"""KV capacity lab (seed 003 E2): does the model's configuration explain the KV capacity and the
concurrency limit the engine really has?

The seed predicts capacity from the model config (layers, KV heads, head dim, attention type,
dtype) and asks for a predicted-vs-observed table whose differences are explained (block
rounding, workspace, parallel replication, special models). Here the observed side is the
ledger of the simulated engines' pools (:mod:`workbench.engines.sim.kvsetup`), built at several
models, device sizes, block sizes, layouts and modes, and filled until it misses; every
difference is one of the rules in :mod:`workbench.labs.kv_capacity.sim`. Three more tables
follow the seed's steps: concurrency at fixed length, preemptions as concurrency rises, and two
requests sharing a prefix (when do references reach zero, and what stays mapped).
"""

from __future__ import annotations

from typing import Any

from workbench.engines.models import get_model
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.resolve import LabRun
from workbench.labs.kit.server_report import real_result
from workbench.labs.kv_capacity.params import KVCapacityParams
from workbench.labs.kv_capacity.report import figures, markdown, record
from workbench.labs.kv_capacity.sim import (
    CapacityCase,
    concurrency,
    measure,
    preemption_sweep,
    shared_prefix,
)
from workbench.units import GiB

# The small pools of the concurrency tables: 8 GiB and 1 GiB of Llama-3.1-8B KV.
CONC_KV_BYTES = 8 * GiB
SWEEP_KV_BYTES = 1 * GiB
SWEEP_LENS = (1000, 200)


def cases(p: KVCapacityParams) -> list[CapacityCase]:
    models, mems, sizes = p.models, p.mem_gib, p.block_sizes
    if p.quick:
        models = tuple(m for m in models if m in ("llama-3.1-8b", "deepseek-v2-lite")) or models
        mems, sizes = (80.0,), (16,)
    out = []
    for model in models:
        get_model(model)  # an unknown name is refused before anything runs
        for mem in mems:
            for bs in sizes:
                for layout in p.layouts:
                    for mode, util in (("static", p.gpu_memory_utilization),
                                       ("elastic", p.kv_gpu_utilization)):
                        out.append(CapacityCase(model, mem, bs, layout, mode, util,
                                                p.activation_gib))
    return out


def run_sim(params: KVCapacityParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    todo = cases(params)
    rows = []
    for i, case in enumerate(todo):
        rows.append(measure(case))
        if progress:
            progress(i + 1, len(todo) + 2, f"{case.model} {case.mem_gib:g} GiB {case.mode}")
    model, bs = params.models[0], params.block_sizes[0]
    conc = concurrency(model, bs, CONC_KV_BYTES, params.context_lens)
    counts = (6, 7) if params.quick else params.concurrency
    sweep = preemption_sweep(model, bs, SWEEP_KV_BYTES, *SWEEP_LENS, counts,
                             seed=params.seed)
    if progress:
        progress(len(todo) + 1, len(todo) + 2, "concurrency and preemption")
    prefix = shared_prefix(model, bs)
    if progress:
        progress(len(todo) + 2, len(todo) + 2, "shared prefix")
    tables: dict[str, list[dict[str, Any]]] = {
        "capacity": rows, "concurrency": conc, "preemption": sweep, "shared_prefix": prefix}
    setup = {"model": model, "block_size": bs, "conc_kv_bytes": CONC_KV_BYTES,
             "sweep_kv_bytes": SWEEP_KV_BYTES, "sweep_lens": SWEEP_LENS}
    return LabResult(record(params, tables, setup, run.backend), markdown(params, tables, setup),
                     tables=tables, figures=figures(tables))


def run_server(params: KVCapacityParams, run: LabRun,
               progress: Progress | None = None) -> LabResult:
    """The server family: this lab's runner over real engine servers."""
    from workbench.labs.kv_capacity.report import vllm_report
    from workbench.labs.kv_capacity.server import run as run_vllm

    return real_result(vllm_report, lambda: run_vllm(run.backend, quick=params.quick))


class KVCapacityLab(Lab):
    name = "kv-capacity"
    description = ("predicted KV blocks / token slots / pages from the model geometry vs what "
                   "the simulated pools really allocate; concurrency and shared-prefix refs; on "
                   "host/gpu a real vLLM's num_gpu_blocks against the formula")
    params_type = KVCapacityParams
    runners = {"simulated": run_sim, "server": run_server}
