"""One record per GPU: what the simulator and the step-time model know about it, and where from.

The simulated device (:mod:`workbench.sim.device`) takes a GPU's memory, VMM granularity and the
latency of each VMM call; the roofline step-time model (:mod:`workbench.engines.sim.steptime`) takes
its memory, peak dense BF16 FLOP/s and HBM bandwidth, and optionally step-time fields fitted to
measured steps. Both read them from here, so a GPU is described once.

Every record says what was measured and where (:class:`Provenance`). A VMM call not measured on
that GPU is listed by ``vmm_unmeasured``: it carries the number of the GPU named in
``vmm_copied_from``, or, without one, an estimate the ``vmm`` text explains. The h100's latencies
are all the h200's, so a result that depends on them is an h200 result under another name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from workbench.errors import ConfigError
from workbench.units import GiB, MiB

VMM_CALLS = ("reserve", "create", "map", "set_access", "unmap", "release")


class VMMLatency(NamedTuple):
    """Seconds per *call* of each VMM operation, whatever its size: the driver's cost barely
    grows with the bytes one call covers (a 128 MiB compound create+map+set-access costs about
    what a 2 MiB one does), so a layout that needs 64 maps per page id pays 64 calls."""

    reserve: float
    create: float
    map: float
    set_access: float
    unmap: float
    release: float


@dataclass(frozen=True, slots=True)
class Provenance:
    vmm: str  # where the measured VMM latencies come from
    vmm_measured: tuple[str, ...]  # calls measured on this GPU (see VMM_CALLS)
    vmm_copied_from: str | None  # the GPU whose numbers stand in for the other calls (None:
    # they are estimates, explained in ``vmm``)
    roofline: str  # where peak FLOP/s and bandwidth come from
    step_fit: str | None = None  # where the fitted step-time fields come from

    @property
    def vmm_unmeasured(self) -> tuple[str, ...]:
        """VMM calls whose latency is a stand-in, not a measurement on this GPU."""
        return tuple(c for c in VMM_CALLS if c not in self.vmm_measured)


@dataclass(frozen=True, slots=True)
class GPUPreset:
    key: str  # the preset name: "h200"
    model: str  # the part: "h200", "a100-80g", "h100-sxm"
    memory_bytes: int
    granularity: int  # VMM allocation granularity (bytes)
    vmm: VMMLatency
    peak_flops: float  # dense BF16 FLOP/s
    peak_bw: float  # HBM bytes/s
    provenance: Provenance
    # Step-time fields fitted to measured steps on this GPU (None: not measured yet).
    step_fit: tuple[tuple[str, float], ...] | None = None


# H200 fit of the mini engine (workbench.mini: decode-only steps replayed as CUDA graphs, steps
# with a prefill chunk eager) with the Llama-3.1-8B shape: 40,149 steps (49 dropped as more than
# 50% off the first fit) of the colocation lab's three-repeat graphs sweep on this project's H200
# (2026-12-01, torch 2.11 + CUDA 13, triton 3.6, driver 580.159.04; PEAKs 6, 12, 2, 9, both
# modes): `run_lab("colocation", lab.params(peaks=(6, 12, 2, 9), repeats=3, cuda_graphs=True,
# out_dir=DIR), "gpu")`, then
# `python -m workbench.bench.calibrate --sweep DIR`. Median error 1.5%, p90 5.1%. A decode-only
# step is bandwidth-bound (~7 ms: 16 GB of weights at bw_eff 0.5 of the data sheet's 4.8 TB/s);
# a step with a prefill pays prefill_overhead_s (17.7 ms: the eager forward's ~600 launches from
# Python) on top; the per-step overhead left is ~0. The sweep's prefill attention still ran on
# cuDNN (one 0.7 s first-shape step in 24 runs, among the dropped steps); it no longer does.
H200_MINI_FIT = (("flops_eff", 0.68), ("bw_eff", 0.5), ("step_overhead_s", 7.1e-6),
                 ("seq_overhead_s", 1.81e-5), ("prefill_overhead_s", 0.0177))

# The earlier fit, of the eager engine (no CUDA graphs: every step ~15 ms of host launches), for
# comparison: 14,936 steps of the eager three-repeat sweep (PEAKs 1-6, same H200, same day),
# median error 12%, p90 35%; bw_eff sat at the grid's top (unconstrained, not measured).
H200_MINI_EAGER_FIT = (("flops_eff", 0.33), ("bw_eff", 1.0), ("step_overhead_s", 0.0153),
                       ("seq_overhead_s", 3.85e-5))

_H200_VMM = VMMLatency(5e-6, 20e-6, 6e-6, 53e-6, 31e-6, 22e-6)

# Step-time profiles fitted to a real engine's steps, by name: the simulated labs select one with
# `--param steptime=NAME` (labs/kit/steptime.py). Each keeps the GPU preset it was fitted on, the
# StepTimeModel fields, what it read of the engine besides step times (`engine`: KV layout, async
# scheduling, client latency; bench/engine_facts.py; the colocation prediction applies them) and
# where it comes from (machine, engine version, model shape, date, steps used, residuals, the
# command). `python -m workbench.bench.calibrate LOGS... --name NAME`
# regenerates the block between the markers (workbench/bench/profiles.py); re-fit, do not edit.
# >>> step profiles
STEP_PROFILES: dict[str, dict] = {
    'vllm026-h200': {
        'gpu': 'h200',
        'model': 'llama-3.1-8b',
        'fields': {
            'flops_eff': 1.0,
            'bw_eff': 0.5,
            'step_overhead_s': 7.306e-05,
            'seq_overhead_s': 1.08e-05,
            'prefill_overhead_s': 0.04986,
            'gpu_switch_s': 0.000636,
            'noise_sd': 0.119,
            'prefill_gpu_frac': 0.341,
        },
        'engine': {
            'kv_blocks_first': True,
            'async_scheduling': True,
            'client_s': 0.0,
        },
        'provenance': {
            'machine': 'NVIDIA H200',
            'engine': 'vllm 0.26.0',
            'model_shape': 'llama-3.1-8b',
            'measured': '2026-12-01 23:45 UTC',
            'date': '2026-12-02',
            'steps_used': 4109,
            'steps_dropped': 272,
            'solo_steps_only': True,
            'context': 'estimated (prompt 256, output 43)',
            'median_rel_err': 0.0783,
            'p90_rel_err': 0.299,
            'residuals': {
                'all': {
                    'steps': 4109,
                    'median_rel_err': 0.0783,
                    'p90_rel_err': 0.299,
                },
                'decode_only': {
                    'steps': 2803,
                    'median_rel_err': 0.0701,
                    'p90_rel_err': 0.109,
                },
                'prefill_host': {
                    'steps': 971,
                    'median_rel_err': 0.1133,
                    'p90_rel_err': 0.2708,
                },
            },
            'prefill_gpu_share': {
                'base_s': 0.00776,
                'beside_s': 0.01287,
                'prefill_period_s': 0.06463,
                'n_base': 2861,
                'n_beside': 2830,
                'gpu_s': 0.02567,
                'own_gpu_s': 0.00866,
            },
            'gpu_switch': {
                'switch_s': 0.000636,
                'base_s': 0.006407,
                'n_base': 885,
                'beside1_s': 0.013965,
                'beside2_s': 0.02122,
                'n_beside1': 630,
                'n_beside2': 1281,
            },
            'engine_facts': {
                'mapped_step_mib': 64,
                'split_page_id_mib': 128,
                'client_s_measured': 0.0066,
                'client_requests': 72,
                'async_scheduling_seen': True,
            },
            'fitted_on': {
                'repeats': 'all',
                'peaks': 'all',
                'points': [
                    'r0 13/elastic (319)',
                    'r0 13/static (314)',
                    'r0 2/elastic (68)',
                    'r0 2/static (64)',
                    'r0 5/elastic (86)',
                    'r0 5/static (80)',
                    'r0 9/elastic (169)',
                    'r0 9/static (252)',
                    'r1 13/elastic (333)',
                    'r1 13/static (352)',
                    'r1 2/elastic (59)',
                    'r1 2/static (70)',
                    'r1 5/elastic (96)',
                    'r1 5/static (80)',
                    'r1 9/elastic (109)',
                    'r1 9/static (236)',
                    'r2 13/elastic (322)',
                    'r2 13/static (351)',
                    'r2 2/elastic (73)',
                    'r2 2/static (74)',
                    'r2 5/elastic (99)',
                    'r2 5/static (103)',
                    'r2 9/elastic (151)',
                    'r2 9/static (249)',
                ],
            },
            'source': ['h200-vllm026-20261201.repeats.json.gz'],
            'command': (
                'python -m workbench.bench.calibrate h200-vllm026-20261201.repeats.json.gz '
                '--name vllm026-h200'
            ),
        },
    },
}
# <<< step profiles


class PageIdCost(NamedTuple):
    """A measured range (seconds) for growing one page id: create+map+set-access of every target."""

    layout: str  # "contiguous" (one compound target) or "per_layer" (one target per layer buffer)
    targets: int  # driver calls of each kind per page id
    low_s: float
    high_s: float
    source: str


# What the per-call figures must reproduce: one 128 MiB page id of a 32-layer Llama-8B-like KV
# (8 KV heads x 128, bf16, 16-token blocks), measured whole on this project's H200 (DESIGN.md,
# Backends; `workbench bench vmm`, raw and workbench subjects over two runs).
H200_PAGE_ID_GROW = (
    PageIdCost("contiguous", 1, 40e-6, 57e-6, "H200 bench vmm, raw driver calls, two runs"),
    PageIdCost("per_layer", 64, 2.5e-3, 2.9e-3, "H200 bench vmm, raw and workbench, two runs"),
)
_DATASHEET = "NVIDIA data sheet (dense BF16, SXM)"

GPU_PRESETS: dict[str, GPUPreset] = {
    "h200": GPUPreset(
        "h200", "h200", 141 * GiB, 2 * MiB, _H200_VMM, 989e12, 4.8e12,
        Provenance("this project's H200, per call of 2 MiB (DESIGN.md, Backends), charged per "
                   "call whatever the size; reserve is an estimate, not among the recorded "
                   "measurements. The sum create+map+set-access (79 us) is above the 40-57 us "
                   "measured for a whole compound page id; the per-layer/contiguous ratio (64) "
                   "is inside the measured 44-73 (H200_PAGE_ID_GROW)",
                   ("create", "map", "set_access", "unmap", "release"), None, _DATASHEET,
                   "40,149 mini-engine steps (decode in CUDA graphs) of the three-repeat "
                   "colocation sweep on this project's H200, 2026-12-01 "
                   "(workbench.bench.calibrate --sweep)"),
        step_fit=H200_MINI_FIT),
    "a100": GPUPreset(
        "a100", "a100-80g", 80 * GiB, 2 * MiB,
        VMMLatency(_H200_VMM.reserve, 193e-6, 1.5e-6, 36e-6, 26e-6, _H200_VMM.release),
        312e12, 2.039e12,
        Provenance("kvcached's bench_vmm on an A100, per call", ("create", "map", "set_access",
                                                                   "unmap"),
                   "h200", _DATASHEET)),
    "h100": GPUPreset(
        "h100", "h100-sxm", 80 * GiB, 2 * MiB, _H200_VMM, 989e12, 3.35e12,
        Provenance("not measured: every call is the h200's number", (), "h200", _DATASHEET)),
}


def step_profile(name: str) -> dict:
    """A fitted profile of :data:`STEP_PROFILES`, or a one-line ConfigError."""
    if name not in STEP_PROFILES:
        have = ", ".join(STEP_PROFILES) or "none yet"
        raise ConfigError(f"step profile {name!r}", f"is not fitted (fitted: {have})",
                          "fit one with python -m workbench.bench.calibrate LOGS... --name NAME")
    return STEP_PROFILES[name]


def gpu_preset(key: str) -> GPUPreset:
    if key not in GPU_PRESETS:
        raise ConfigError(f"gpu {key!r}", "has no preset", f"use one of {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[key]


__all__ = ["GPU_PRESETS", "H200_MINI_EAGER_FIT", "H200_MINI_FIT", "H200_PAGE_ID_GROW", "GPUPreset",
           "PageIdCost", "Provenance", "STEP_PROFILES", "VMMLatency", "VMM_CALLS", "gpu_preset",
           "step_profile"]
