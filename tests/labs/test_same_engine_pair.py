"""same-engine-pair (seed 000 §7): what one instance frees the other maps; one physical
headroom; a graceful exit returns everything; same vs separate IPC names on the real control
plane. The checks read the raw timelines."""

from __future__ import annotations

import json
import os

import pytest

from workbench.config import PoolConfig
from workbench.core.control import read_segment
from workbench.engines.models import get_model
from workbench.engines.sim.kvsetup import elastic_pool
from workbench.errors import ConfigError
from workbench.labs import run_lab
from workbench.labs.kit.ipc_names import ipc_names_demo, summary
from workbench.labs.kit.phased_sim import run_phased
from workbench.labs.same_engine_pair.lab import PairParams
from workbench.labs.same_engine_pair.sim import pair_spec
from workbench.sim.device import SimDevice
from workbench.units import GiB

P = PairParams(quick=True)


def _win(run: dict, name: str, phase: str) -> dict:
    w = next(w for w in run["windows"][name] if w["name"] == phase)
    tl = run["timeline"][name]
    idx = [i for i, t in enumerate(tl["t"]) if w["start"] - 1e-9 <= t < w["end"] - 1e-9]
    return {k: [v[i] for i in idx] for k, v in tl.items()}


@pytest.fixture(scope="module", params=[(0, "vllm"), (1, "vllm"), (0, "sglang")],
            ids=["vllm-first0", "vllm-first1", "sglang-first0"])
def pair(request) -> tuple[dict, str, str]:
    first, kind = request.param
    p = PairParams(quick=True, kind=kind)
    run = run_phased(pair_spec(p, seed=3, first=first))
    names = [i["name"] for i in run["instances"]]
    return run, names[first], names[1 - first]


def test_B_only_the_peaking_instance_maps(pair):
    run, f, s = pair
    assert max(_win(run, f, "B")["mapped_bytes"]) > _win(run, f, "A")["mapped_bytes"][-1]
    floor = _win(run, s, "A")["mapped_bytes"][-1]
    assert set(_win(run, s, "B")["mapped_bytes"]) == {floor}  # null page + min reserve
    assert floor == (1 + run["min_reserved"]) * run["page_id_bytes"]


def test_C_freed_memory_is_mapped_by_the_other(pair):
    run, f, s = pair
    c = _win(run, f, "C")
    assert c["running"][-1] == 0 and c["in_use_pages"][-1] == 1  # drained: the null page only
    assert c["mapped_bytes"][-1] == (1 + c["reserved_pages"][-1]) * run["page_id_bytes"]
    # the other maps more than was left for it at the first one's peak: memory the first held
    peak_b = max(_win(run, f, "B")["mapped_bytes"])
    assert max(_win(run, s, "C")["mapped_bytes"]) + peak_b > run["kv_budget_bytes"]


def test_one_physical_headroom(pair):
    run, f, s = pair
    tl = run["timeline"]
    total = [a + b for a, b in zip(tl[f]["mapped_bytes"], tl[s]["mapped_bytes"], strict=True)]
    assert max(total) <= run["kv_budget_bytes"]
    d = [a + b for a, b in zip(_win(run, f, "D")["mapped_bytes"],
                               _win(run, s, "D")["mapped_bytes"], strict=True)]
    assert max(d) >= run["kv_budget_bytes"] - 2 * run["page_id_bytes"]  # D fills it
    by = {i["name"]: i["by_phase"] for i in run["instances"]}
    assert by[f]["D"]["ttft"]["p99"] > by[f]["B"]["ttft"]["p99"]
    assert by[s]["D"]["ttft"]["p99"] > by[s]["C"]["ttft"]["p99"]
    assert run["live_unmaps"] == []


def test_E_graceful_exit_returns_everything(pair):
    run, f, s = pair
    t_exit = run["shutdowns"][f]
    tl = run["timeline"]
    after = [i for i, t in enumerate(tl[f]["t"]) if t > t_exit + 1e-9]
    assert after and all(tl[f]["mapped_bytes"][i] == 0 for i in after)
    assert max(tl[s]["mapped_bytes"][i] for i in after) > max(_win(run, s, "D")["mapped_bytes"])


def test_ipc_names_separate_and_same():
    prefix = f"wbtest-pair-{os.getpid()}"
    demo = ipc_names_demo(prefix=prefix)
    got = summary(demo)
    assert {k: v for k, v in got.items() if k != "same_name_error"} == {
        "refused_pool_left_mapped_bytes": 0,  # a refused pool gives back what it mapped
        "separate_segments": True, "a_mapped_seen_only_in_a": True, "headroom_shared": True,
        "limit_pending_until_poll": True, "limit_applies_to_a_only": True,
        "same_name_refused": True, "name_free_after_close": True, "segments_removed": True}
    assert "in use by live process" in got["same_name_error"]
    assert read_segment(f"{prefix}-a") is None and read_segment(f"{prefix}-b") is None


def test_same_name_is_refused_directly():
    dev = SimDevice("h200", capacity=2 * GiB)
    spec = get_model("llama-3.1-8b")
    name = f"wbtest-dup-{os.getpid()}"
    cfg = PoolConfig(ipc_name=name, prealloc=False)
    a = elastic_pool(spec, dev, name="a", config=cfg).kv
    try:
        with pytest.raises(ConfigError, match="in use by live process"):
            elastic_pool(spec, dev, name="b", config=cfg)
    finally:
        a.close()
    assert read_segment(name) is None


def test_lab_record():
    res = run_lab("same-engine-pair", P, "sim")
    d = json.loads(res.record.to_json())
    assert d["verdict"].startswith("supported")
    assert d["samples"]["first_peaking"] == [0, 1]
    assert len(res.tables["checks"]) == 2 and res.tables["ipc_steps"]
    assert "| C | the drained instance gives back" in res.markdown
    assert d["results"]["ipc_summary"]["same_name_refused"] is True
