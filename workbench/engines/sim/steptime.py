"""Roofline step-time model: how long one engine iteration takes on a GPU.

A step runs a batch of sequences; sequence ``i`` computes ``q_i`` new tokens over a context of
``c_i`` tokens (prefill chunk: q_i = chunk, decode: q_i = 1). The model charges

* compute: ``2 * active_params * sum(q)`` (GEMMs) + ``4 * L * H * d * sum(q_i * c_i)`` (QK^T and
  PV; a prefill chunk attends causally, so its own tokens count half);
* memory: weights once per step + KV read ``sum(c_i) * kv_bytes_per_token`` + KV write
  ``sum(q) * kv_bytes_per_token``;

and takes ``max(flops / (peak_flops * flops_eff), bytes / (peak_bw * bw_eff))`` plus a fixed
per-step overhead and a per-sequence overhead (scheduling, input prep, sampling, launches).

Defaults and where they come from (all are fields, so they can be calibrated later):

* peak dense BF16 FLOP/s and HBM bandwidth: NVIDIA data sheets (A100-80G SXM 312 TFLOP/s,
  2.039 TB/s; H100 SXM 989 TFLOP/s, 3.35 TB/s; H200 989 TFLOP/s, 4.8 TB/s).
* ``bw_eff = 0.80``: a decode GEMV streams weights at ~75-85% of peak on Ampere/Hopper (vendor
  STREAM-like numbers; this project measured 4.27 of 4.8 TB/s = 0.89 on an H200 copy kernel).
* ``flops_eff = 0.60``: large-token prefill GEMMs reach ~55-70% MFU in vLLM/SGLang profiles
  (Vidur's profiled MLP tables are in that range); a guess until calibrated.
* ``prefill_gpu_frac = 0``: the share of ``prefill_overhead_s`` that holds the GPU; a real
  engine's eager, launch-bound prefill forward slows the other processes' steps on the GPU too
  (measured from their decodes beside it: ``workbench.bench.steprows.prefill_gpu_share``).
* ``step_overhead_s = 2.5 ms`` and ``seq_overhead_s = 15 us``: vLLM V1 CPU-side scheduling, input
  preparation, sampling and detokenisation per iteration (order of magnitude from the vLLM V1 blog's
  "CPU overhead" discussion and Vidur's ``cpu_overhead`` profiles); a guess until calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from workbench.engines.models import ModelSpec, get_model
from workbench.errors import ConfigError
from workbench.hardware import GPU_PRESETS, H200_MINI_FIT  # noqa: F401 - H200_MINI_FIT re-exported


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_flops: float  # dense BF16 FLOP/s
    peak_bw: float  # HBM bytes/s
    memory_bytes: int
    # Step-time fields fitted to measured steps on this GPU (None: not measured yet).
    fitted: tuple[tuple[str, float], ...] | None = None


# One record per GPU in workbench.hardware (memory, peaks, the fitted fields and where each number
# comes from); H200_MINI_FIT is the H200 fit of the mini engine described there.
GPUS: dict[str, GPUSpec] = {k: GPUSpec(g.model, g.peak_flops, g.peak_bw, g.memory_bytes,
                                       fitted=g.step_fit) for k, g in GPU_PRESETS.items()}


class StepCost(NamedTuple):
    gpu_s: float  # kernels: holds the GPU (co-located instances time-slice it)
    cpu_s: float  # scheduling, input prep, sampling: host-side, overlaps other instances' kernels

    @property
    def total_s(self) -> float:
        return self.gpu_s + self.cpu_s


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    model: ModelSpec
    gpu: GPUSpec
    flops_eff: float = 0.60
    bw_eff: float = 0.80
    step_overhead_s: float = 2.5e-3
    seq_overhead_s: float = 15e-6
    # host cost added to a step that computes a prefill chunk (new tokens > sequences): an engine
    # that replays decode-only steps as CUDA graphs runs those eagerly (0: one cost for both)
    prefill_overhead_s: float = 0.0
    # the share of ``prefill_overhead_s`` that holds the GPU (0: all host-side). A real engine's
    # eager prefill forward keeps its context busy with launch-bound kernels, which slows the
    # other processes' steps on the same GPU although its own time is mostly launches.
    prefill_gpu_frac: float = 0.0
    # GPU time lost when the GPU turns from one engine's (process's) step to another's: its
    # time-slicing between contexts (0: free; measured from decodes beside decodes, steprows)
    gpu_switch_s: float = 0.0
    # a real step scatters around the model (the fit's residuals): each step's time is scaled
    # by exp(N(0, noise_sd)), drawn per engine from ``noise_seed`` (0: deterministic steps)
    noise_sd: float = 0.0
    noise_seed: int = 0

    @classmethod
    def preset(cls, model: str | ModelSpec, gpu: str = "a100", *, fitted: bool = False,
               **overrides) -> StepTimeModel:
        """Roofline defaults for ``model`` on ``gpu``; ``fitted=True`` takes the fields measured
        on that GPU instead (see :data:`H200_MINI_FIT`); ``overrides`` win over both."""
        if gpu not in GPUS:
            raise ConfigError(f"gpu {gpu!r}", "has no preset", f"use one of {', '.join(GPUS)}")
        spec = GPUS[gpu]
        if fitted and spec.fitted is None:
            raise ConfigError(f"fitted step times for {gpu!r}", "have not been measured",
                              "calibrate with workbench.bench.calibrate on that GPU, or use the "
                              "roofline defaults (fitted=False)")
        base = dict(spec.fitted) if fitted else {}
        return replace(cls(get_model(model), spec), **{**base, **overrides})

    def step_time(self, num_seqs: int, new_tokens: int, ctx_tokens: int,
                  attn_pairs: float) -> float:
        """Seconds for one step.

        ``new_tokens`` = sum(q_i); ``ctx_tokens`` = sum(c_i) (KV read); ``attn_pairs`` =
        sum(q_i * c_i) query-key pairs (see :func:`workbench.engines.sched.scheduler.attn_pairs`).
        """
        c = self.cost(num_seqs, new_tokens, ctx_tokens, attn_pairs)
        return c.gpu_s + c.cpu_s

    def cost(self, num_seqs: int, new_tokens: int, ctx_tokens: int,
             attn_pairs: float) -> StepCost:
        """The step split into its GPU part and its host part."""
        if num_seqs == 0:
            return StepCost(0.0, 0.0)
        m = self.model
        flops = 2.0 * m.active_params * new_tokens + \
            4.0 * m.num_layers * m.q_heads * m.attn_head_dim * attn_pairs
        kvb = m.kv_bytes_per_token
        nbytes = m.weight_bytes + (ctx_tokens + new_tokens) * kvb
        t = max(flops / (self.gpu.peak_flops * self.flops_eff),
                nbytes / (self.gpu.peak_bw * self.bw_eff))
        host = self.step_overhead_s + self.seq_overhead_s * num_seqs
        if new_tokens > num_seqs:
            t += self.prefill_overhead_s * self.prefill_gpu_frac
            host += self.prefill_overhead_s * (1.0 - self.prefill_gpu_frac)
        return StepCost(t, host)
