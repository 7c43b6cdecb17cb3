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

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.engines.models import MODELS, get_model
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import QUICK, SEED, VLLM_ONLY
from workbench.labs.kit.vllm_report import real_result
from workbench.labs.kv_capacity.report import figures, markdown, record
from workbench.labs.kv_capacity.sim import (
    CapacityCase,
    concurrency,
    measure,
    preemption_sweep,
    shared_prefix,
)
from workbench.ranges import Choices, Floats, Ints, Num, Spec
from workbench.units import GiB


@dataclass(slots=True)
class KVCapacityParams:
    models: tuple[str, ...] = ("llama-3.1-8b", "qwen3-8b", "deepseek-v2-lite")
    mem_gib: tuple[float, ...] = (24.0, 48.0, 80.0, 141.0)  # device sizes
    block_sizes: tuple[int, ...] = (16, 32)
    layouts: tuple[str, ...] = ("contiguous", "per_layer")
    gpu_memory_utilization: float = 0.9  # static split (vLLM's default)
    kv_gpu_utilization: float = 0.95  # elastic pool headroom (kvcached's default)
    activation_gib: float = 2.2  # profiled activations + CUDA graphs, outside the KV budget
    context_lens: tuple[int, ...] = (100, 1000, 4000, 16000)  # concurrency at fixed length
    concurrency: tuple[int, ...] = (4, 5, 6, 7, 8)  # preemption sweep (1000 in / 200 out)
    quick: bool = False  # llama + the MLA model, 80 GiB, block 16, both layouts
    seed: int = 0
    engine: str = "vllm"  # on sim the simulated vLLM-like pools; on host/gpu a real vLLM
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "models": Choices(tuple(MODELS)), "mem_gib": Floats(1.0, 192.0, 16, "GiB"),
        "block_sizes": Ints(8, 1024), "layouts": Choices(("contiguous", "per_layer")),
        "gpu_memory_utilization": Num(float, 0.01, 1.0),
        "kv_gpu_utilization": Num(float, 0.01, 1.0),
        "activation_gib": Num(float, 0.0, 1024.0, "GiB"),
        "context_lens": Ints(1, 131072), "concurrency": Ints(1, 1024), "quick": QUICK,
        "seed": SEED,
        "engine": VLLM_ONLY,
    }


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


class KVCapacityLab(Lab):
    name = "kv-capacity"
    description = ("predicted KV blocks / token slots / pages from the model geometry vs what "
                   "the simulated pools really allocate; concurrency and shared-prefix refs; on "
                   "host/gpu a real vLLM's num_gpu_blocks against the formula")
    params_type = KVCapacityParams
    backends = ("sim", "host", "gpu")

    def check_backend(self, backend: str, params: Any = None) -> None:
        from workbench.labs.kit.vllm_rig import check_engine

        Lab.check_backend(self, backend, params)
        check_engine(self.name, backend, getattr(params, "engine", "vllm"), "vllm")

    def run(self, params: KVCapacityParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.labs.kit.vllm_rig import on_real

        if on_real(backend, params.engine):  # a real vLLM: this lab's .vllm runner
            from workbench.labs.kv_capacity.report import vllm_report
            from workbench.labs.kv_capacity.vllm import run as run_vllm

            return real_result(vllm_report, lambda: run_vllm(backend, quick=params.quick))
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
        return LabResult(record(params, tables, setup, backend), markdown(params, tables, setup),
                         tables=tables, figures=figures(tables))
