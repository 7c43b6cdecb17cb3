"""The step profile's device parts, wired on a CPU: every part runs through the model's own
modules (torch kernels there), and the parts and the rest add up to the forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.bench import stepprof  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402


def test_parts_run_each_op_of_every_layer_and_add_up(monkeypatch):
    cfg = get_config("tiny")
    model = build_model(cfg, "cpu")
    inp = stepprof.decode_inputs(cfg, batch=3, ctx=37, device="cpu")
    calls: list[str] = []

    def fake_graph_ms(fn):  # no CUDA graph on a CPU: run once, count each part as 1 ms
        fn()
        calls.append(fn.__name__)
        return 1.0 + len(calls)

    monkeypatch.setattr(stepprof, "graph_ms", fake_graph_ms)
    wslots = inp["ctx"].wb * stepprof.BLOCK + inp["ctx"].wo
    assert torch.equal(wslots, inp["table"][:, 37 // 16].long() * 16 + 37 % 16)
    before = inp["k"][0].flatten(0, 1)[wslots].clone()
    parts = stepprof._parts(model, cfg, inp, "torch")
    assert calls == ["forward", "norms", "rotary", "silu", "kernel", "attend"]
    assert parts == {"forward": 2.0, "norms + adds": 3.0, "rotary": 4.0, "silu x up": 5.0,
                     "paged kernel": 6.0, "attention glue": 7.0 - 6.0}
    # the forward and the attend part wrote each sequence's new K at its slot, every layer
    assert not torch.equal(inp["k"][0].flatten(0, 1)[wslots], before)
    assert inp["lens32"].dtype == torch.int32 and inp["lens32"].tolist() == [38] * 3


def test_summary_lists_both_kernel_sets_and_the_host_split():
    part = {"forward": 10.0, "matmuls": 5.0, "rest": 1.0}
    lines = stepprof.summary({"batch": 8, "ctx": 100, "torch": part,
                              "triton": {**part, "forward": 8.0},
                              "kernels_torch": "profiler saw no device kernels",
                              "kernels_triton": [{"kernel": "(all)", "count": 3, "us": 7.5}]},
                             {"step": 2.0, "forward": 1.5})
    assert "    forward          10.000 ->   8.000" in lines
    assert "    eager kernels (torch): profiler saw no device kernels" in lines
    assert "            7.5 (    3) (all)" in lines
    assert lines[-1] == "  host split of a graphed step (ms per step): step 2.000, forward 1.500"
