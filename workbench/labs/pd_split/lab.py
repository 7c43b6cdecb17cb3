"""The pd-split lab: its parameters and the Lab that runs them (the experiment:
:mod:`.sim`, :mod:`.real`; the record and the Markdown: :mod:`.report`)."""

from __future__ import annotations

from workbench.errors import ConfigError
from workbench.labs.kit.base import Lab, LabResult, Progress
from workbench.labs.kit.report import without_repeats
from workbench.labs.kit.resolve import LabRun
from workbench.labs.pd_split.params import PDSplitParams
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


def _gpus(params: PDSplitParams) -> PDSplitParams:
    if params.gpus not in (1, 2):  # read by host/gpu only, but wrong everywhere
        raise ConfigError(f"gpus={params.gpus}", "the real handover runs one prefill engine "
                          "and one decode engine", "use gpus=2 (one GPU each) or gpus=1")
    return params


def run_sim(params: PDSplitParams, run: LabRun,
            progress: Progress | None = None) -> LabResult:
    _gpus(params)
    single = single_requests(config(params), seed=params.seed)
    rows = sweep(params, progress)
    table = without_repeats(rows)
    ratios = ratio_sweep(config(params), params.ratio_gpus, params.ratio_rate,
                         min(params.num_requests, 150), params.seed) \
        if params.ratio_gpus else []
    rec = record(params, rows, single, run.backend)
    rec.results.update(ratios=ratios, best_splits=best_splits(ratios))
    figs = figures(table, single)
    if ratios and (fig := ratio_figure(ratios)) is not None:
        figs["ratios"] = fig
    md = markdown(params, table, single)
    md += "\n".join(ratio_markdown(ratios, params.ratio_gpus, params.ratio_rate)) + "\n"
    return LabResult(rec, md, tables={"sweep": table, "ratios": ratios}, figures=figs)


def run_mini(params: PDSplitParams, run: LabRun,
             progress: Progress | None = None) -> LabResult:
    """The real handover between two mini engines, against one colocated."""
    from workbench.labs.pd_split.real import placement, run_real
    from workbench.labs.pd_split.real_report import figures as real_figures
    from workbench.labs.pd_split.real_report import markdown as real_markdown
    from workbench.labs.pd_split.real_report import record as real_record

    placement(run.backend, _gpus(params).gpus)  # refuse before building anything
    if params.real_max_tokens < 1:
        raise ConfigError(f"real_max_tokens={params.real_max_tokens}", "must be at least 1",
                          "use e.g. 16")
    lens = params.real_prompt_lens[:2] if params.quick else params.real_prompt_lens
    if not lens or min(lens) < 1:
        raise ConfigError(f"real_prompt_lens={params.real_prompt_lens}",
                          "needs at least one prompt length of 1 or more", "use e.g. 100,1000")
    out = run_real(run.backend, params.real_model, params.gpus, tuple(lens),
                   params.real_max_tokens)
    return LabResult(real_record(params, out, run.backend), real_markdown(out, run.backend),
                     tables={"handover": out["rows"]}, figures=real_figures(out))


class PDSplitLab(Lab):
    name = "pd-split"
    description = ("prefill/decode disaggregation vs colocated serving at the same GPU count: "
                   "TTFT, TPOT and goodput as the long-prompt share and the rate rise (E7)")
    params_type = PDSplitParams
    runners = {"simulated": run_sim, "mini": run_mini}
