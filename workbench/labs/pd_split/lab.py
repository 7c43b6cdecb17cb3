"""The pd-split lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.real`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workbench.engines.models import MODELS
from workbench.errors import ConfigError
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.params import (
    GBPS,
    GPU,
    LONG_SHARES,
    QUICK,
    RATE,
    RATES,
    REQUESTS,
    SEED,
)
from workbench.labs.kit.report import without_repeats
from workbench.labs.pd_split.report import (
    best_splits,
    figures,
    markdown,
    ratio_figure,
    ratio_markdown,
    record,
)
from workbench.labs.pd_split.sim import (
    config,
    ratio_sweep,
    single_requests,
    sweep,
)
from workbench.ranges import Choice, Ints, Num, Spec


@dataclass(slots=True)
class PDSplitParams:
    rates: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)  # req/s of the whole mix
    long_shares: tuple[float, ...] = (0.1, 0.25, 0.5)
    num_requests: int = 300  # per mode, rate, share and repeat
    repeats: int = 2
    prefill: int = 1  # PD's prefill instances; colocated runs prefill + decode instances
    decode: int = 1
    link_gbps: float = 25.0  # GB/s (assumed: a 200 Gb/s NIC's line rate)
    link_latency_us: float = 50.0
    gpu: str = "a100"
    ratio_gpus: int = 4  # the P:D ratio step: every split of this many GPUs (0: skip it)
    ratio_rate: float = 8.0  # req/s for the ratio step
    seed: int = 0
    quick: bool = False  # shares 0.1 and 0.5 at 1 and 4 req/s, 150 requests, one repeat
    # host/gpu (the real handover): GPUs (2: prefill on GPU 0, decode on GPU 1; 1: both on one)
    gpus: int = 2
    real_model: str = ""  # "": tiny on host, llama-3.1-8b on gpu
    real_prompt_lens: tuple[int, ...] = (100, 1000, 4000)  # one request each (quick: 100, 1000)
    real_max_tokens: int = 16
    RANGES: ClassVar[dict[str, Spec]] = {  # every field's declared range (kit/params)
        "rates": RATES, "long_shares": LONG_SHARES, "num_requests": REQUESTS,
        "repeats": Num(int, 1, 20), "prefill": Num(int, 1, 16), "decode": Num(int, 1, 16),
        "link_gbps": GBPS, "link_latency_us": Num(float, 0.0, 1e6, "us"), "gpu": GPU,
        "ratio_gpus": Num(int, 0, 16), "ratio_rate": RATE, "seed": SEED, "quick": QUICK,
        "gpus": Num(int, 1, 2), "real_model": Choice(("", *MODELS)),
        "real_prompt_lens": Ints(1, 32768), "real_max_tokens": Num(int, 1, 4096, "tokens"),
    }


class PDSplitLab(Lab):
    name = "pd-split"
    description = ("prefill/decode disaggregation vs colocated serving at the same GPU count: "
                   "TTFT, TPOT and goodput as the long-prompt share and the rate rise (E7)")
    params_type = PDSplitParams
    backends = ("sim", "host", "gpu")

    def run(self, params: PDSplitParams, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
        from workbench.backends import capabilities

        if params.gpus not in (1, 2):  # read by host/gpu only, but wrong everywhere
            raise ConfigError(f"gpus={params.gpus}", "the real handover runs one prefill engine "
                              "and one decode engine", "use gpus=2 (one GPU each) or gpus=1")
        if not capabilities(backend).simulated:
            return self.run_real(params, backend)
        single = single_requests(config(params), seed=params.seed)
        rows = sweep(params, progress)
        table = without_repeats(rows)
        ratios = ratio_sweep(config(params), params.ratio_gpus, params.ratio_rate,
                             min(params.num_requests, 150), params.seed) \
            if params.ratio_gpus else []
        rec = record(params, rows, single, backend)
        rec.results.update(ratios=ratios, best_splits=best_splits(ratios))
        figs = figures(table, single)
        if ratios and (fig := ratio_figure(ratios)) is not None:
            figs["ratios"] = fig
        md = markdown(params, table, single)
        md += "\n".join(ratio_markdown(ratios, params.ratio_gpus, params.ratio_rate)) + "\n"
        return LabResult(rec, md, tables={"sweep": table, "ratios": ratios}, figures=figs)

    def run_real(self, params: PDSplitParams, backend: str) -> LabResult:
        from workbench.labs.pd_split.real import placement, run_real
        from workbench.labs.pd_split.real_report import figures as real_figures
        from workbench.labs.pd_split.real_report import markdown, record

        placement(backend, params.gpus)  # refuse before building anything
        if params.real_max_tokens < 1:
            raise ConfigError(f"real_max_tokens={params.real_max_tokens}", "must be at least 1",
                              "use e.g. 16")
        lens = params.real_prompt_lens[:2] if params.quick else params.real_prompt_lens
        if not lens or min(lens) < 1:
            raise ConfigError(f"real_prompt_lens={params.real_prompt_lens}",
                              "needs at least one prompt length of 1 or more", "use e.g. 100,1000")
        run = run_real(backend, params.real_model, params.gpus, tuple(lens),
                       params.real_max_tokens)
        return LabResult(record(params, run, backend), markdown(run, backend),
                         tables={"handover": run["rows"]}, figures=real_figures(run))
