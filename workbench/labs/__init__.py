"""Labs: experiments behind one protocol (:mod:`workbench.labs.base`), each returning a
:class:`~workbench.labs.base.LabResult` (record + tables + figures + Markdown).

The registry maps a lab's name to the class that implements it, imported on first use so
``workbench labs list`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.errors import ConfigError

if TYPE_CHECKING:
    from workbench.labs.base import Lab, LabResult, Progress

LABS: dict[str, str] = {
    "colocation": "workbench.labs.colocation:ColocationLab",
    "idle-footprint": "workbench.labs.idle_footprint:IdleFootprintLab",
    "grow-reclaim": "workbench.labs.grow_reclaim:GrowReclaimLab",
    "same-engine-pair": "workbench.labs.same_engine_pair:SameEnginePairLab",
    "cross-engine": "workbench.labs.cross_engine:CrossEngineLab",
    "prefix-bound": "workbench.labs.prefix_bound:PrefixBoundLab",
    "kv-capacity": "workbench.labs.kv_capacity:KVCapacityLab",
    "baseline": "workbench.labs.baseline:BaselineLab",
    "chunked-prefill": "workbench.labs.chunked_prefill:ChunkedPrefillLab",
    "control-groups": "workbench.labs.control_groups:ControlGroupsLab",
    "no-fake-enable": "workbench.labs.no_fake_enable:NoFakeEnableLab",
    "dynamic-limit": "workbench.labs.dynamic_limit:DynamicLimitLab",
    "tp-pp": "workbench.labs.tp_pp:TpPpLab",
    "faults": "workbench.labs.faults:FaultsLab",
    "output-equality": "workbench.labs.output_equality:OutputEqualityLab",
    "tiered-retrieval": "workbench.labs.tiered_retrieval:TieredRetrievalLab",
    "store-routes": "workbench.labs.store_routes:StoreRoutesLab",
    "pd-split": "workbench.labs.pd_split:PDSplitLab",
    "transfer-faults": "workbench.labs.transfer_faults:TransferFaultsLab",
    "non-prefix-reuse": "workbench.labs.non_prefix_reuse:NonPrefixReuseLab",
}


def get_lab(name: str) -> Lab:
    if name not in LABS:
        raise ConfigError(f"lab {name!r}", "is not a lab", f"use one of {', '.join(LABS)}")
    module, _, cls = LABS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def run_lab(name: str, params: Any = None, backend: str = "sim",
            progress: Progress | None = None) -> LabResult:
    """Check the backend first (refusing before anything runs), then run lab ``name``."""
    lab = get_lab(name)
    params = params if params is not None else lab.params()
    lab.check_backend(backend, params)
    return lab.run(params, backend, progress)
