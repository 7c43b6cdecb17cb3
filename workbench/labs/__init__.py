"""Labs: experiments behind one protocol (:mod:`workbench.labs.kit.base`), each returning a
:class:`~workbench.labs.kit.base.LabResult` (record + tables + figures + Markdown).

The registry maps a lab's name to the class that implements it, imported on first use so
``workbench labs list`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.errors import ConfigError

if TYPE_CHECKING:
    from workbench.labs.kit.base import Lab, LabResult, Progress

LABS: dict[str, str] = {
    "colocation": "workbench.labs.colocation.lab:ColocationLab",
    "idle-footprint": "workbench.labs.idle_footprint.lab:IdleFootprintLab",
    "grow-reclaim": "workbench.labs.grow_reclaim.lab:GrowReclaimLab",
    "same-engine-pair": "workbench.labs.same_engine_pair.lab:SameEnginePairLab",
    "cross-engine": "workbench.labs.cross_engine.lab:CrossEngineLab",
    "prefix-bound": "workbench.labs.prefix_bound.lab:PrefixBoundLab",
    "kv-capacity": "workbench.labs.kv_capacity.lab:KVCapacityLab",
    "baseline": "workbench.labs.baseline.lab:BaselineLab",
    "chunked-prefill": "workbench.labs.chunked_prefill.lab:ChunkedPrefillLab",
    "control-groups": "workbench.labs.control_groups.lab:ControlGroupsLab",
    "no-fake-enable": "workbench.labs.no_fake_enable.lab:NoFakeEnableLab",
    "dynamic-limit": "workbench.labs.dynamic_limit.lab:DynamicLimitLab",
    "tp-pp": "workbench.labs.tp_pp.lab:TpPpLab",
    "faults": "workbench.labs.faults.lab:FaultsLab",
    "output-equality": "workbench.labs.output_equality.lab:OutputEqualityLab",
    "tiered-retrieval": "workbench.labs.tiered_retrieval.lab:TieredRetrievalLab",
    "store-routes": "workbench.labs.store_routes.lab:StoreRoutesLab",
    "pd-split": "workbench.labs.pd_split.lab:PDSplitLab",
    "transfer-faults": "workbench.labs.transfer_faults.lab:TransferFaultsLab",
    "non-prefix-reuse": "workbench.labs.non_prefix_reuse.lab:NonPrefixReuseLab",
}


def get_lab(name: str) -> Lab:
    if name not in LABS:
        raise ConfigError(f"lab {name!r}", "is not a lab", f"use one of {', '.join(LABS)}")
    module, _, cls = LABS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def run_lab(name: str, params: Any = None, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
    """Check the parameters as the command line does (the lab's own dataclass or a mapping of
    its names, every value against its declared range), then resolve the run and run lab
    ``name`` (:meth:`~workbench.labs.kit.base.Lab.run`): every refusal comes before anything
    runs."""
    lab = get_lab(name)
    params = lab.check_params(params if params is not None else lab.params())
    return lab.run(params, backend, progress)
