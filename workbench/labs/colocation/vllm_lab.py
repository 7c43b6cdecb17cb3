"""The colocation lab's ``engine=vllm`` runner on ``gpu``/``host``: the lab's parameters as a
:class:`~.vllm.VllmColoConfig`, the sweep run (or its repeat files read back, several calls'
folders merged), then the lab's :class:`ColocationRun`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.backends import capabilities
from workbench.errors import ConfigError
from workbench.labs.colocation.rows import ColocationRun, reading_sweep
from workbench.labs.colocation.saved import merged
from workbench.labs.colocation.vllm import VllmColoConfig
from workbench.labs.kit.base import Progress

if TYPE_CHECKING:
    from workbench.labs.colocation.params import ColocationParams

GPU_PEAKS = (2, 4, 7, 10, 14)  # low load, near the static split's knee, past it, overload
HOST_PEAKS = (1, 2)


def config_for(params: ColocationParams, backend: str) -> VllmColoConfig:
    cuda = capabilities(backend).cuda
    cfg = VllmColoConfig(
        model=params.model or ("llama-3.1-8b" if cuda else "host"),
        budget_gib=params.budget_gib, time_scale=params.time_scale,
        prompt_len=params.prompt_len, completion_len=params.completion_len, seed=params.seed,
        repeats=params.repeats, first_repeat=params.first_repeat, out_dir=params.out_dir,
        device="cuda" if cuda else "cpu", cuda_graphs=params.cuda_graphs is not False,
        together=cuda if params.together is None else params.together,
        deadline_s=params.deadline_s, peaks=tuple(params.peaks or
                                                  (GPU_PEAKS if cuda else HOST_PEAKS)))
    if not cuda:  # a smoke run on the CPU: few, short requests
        cfg.max_num_seqs, cfg.max_batched_tokens = 16, 512
    if params.quick:
        cfg.peaks = cfg.peaks[:2]
    return cfg


def run_vllm(params: ColocationParams, backend: str,
             progress: Progress | None = None) -> ColocationRun:
    from workbench.labs.colocation.vllm_report import from_repeats

    if params.from_dir:
        reps = merged(params.from_dir)
        with reading_sweep(f"from_dir={params.from_dir!r}"):
            return from_repeats(reps, backend)
    from workbench.labs.colocation.vllm import run

    cfg = config_for(params, backend)
    done, total = [0], len(cfg.peaks) * len(cfg.modes) * cfg.repeats

    def log(msg: str) -> None:
        print(msg, flush=True)
        done[0] += 1
        if progress is not None:
            progress(done[0], total, msg.split(":")[0])

    reps = run(cfg, log=log)
    if not any(r["runs"] for r in reps):
        raise ConfigError("the colocation sweep on real vLLM", "finished no point",
                          "raise deadline_s or run fewer peaks")
    return from_repeats([r for r in reps if r["runs"]], backend)
