"""The mini engine behind the Engine protocol (:class:`MiniInstance`), and its model presets
coming from the one model registry."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.engines.base import Engine as EngineProtocol  # noqa: E402
from workbench.engines.models import MODELS  # noqa: E402
from workbench.engines.sched.request import Request  # noqa: E402
from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.engine import Engine  # noqa: E402
from workbench.mini.instance import MiniInstance  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

CFG = get_config("tiny")


def test_the_mini_model_speaks_the_registrys_vocabulary():
    # every shape field of the mini engine's config is a field of the registry's ModelSpec or
    # DecoderShape under the same name (the seed of the random weights is the mini's own)
    from dataclasses import fields

    from workbench.engines.models import DecoderShape, ModelSpec
    from workbench.mini.model import ModelConfig

    registry = {f.name for f in fields(ModelSpec)} | {f.name for f in fields(DecoderShape)}
    assert {f.name for f in fields(ModelConfig)} - registry == {"seed"}
    assert CFG.decoder == MODELS["tiny"].decoder


def test_mini_presets_come_from_the_registry():
    spec = MODELS["tiny"]
    assert (CFG.num_layers, CFG.q_heads, CFG.kv_heads, CFG.head_dim) == \
        (spec.num_layers, spec.q_heads, spec.kv_heads, spec.head_dim)
    assert CFG.params == spec.params and CFG.kv_bytes_per_token == spec.kv_bytes_per_token
    llama = get_config("llama-3.1-8b")
    assert llama.name == "llama-3.1-8b" and get_config("llama3-8b") == llama
    assert get_config("tiny", seed=3).seed == 3
    with pytest.raises(ConfigError, match="no Llama-shaped decoder"):
        get_config("deepseek-v2-lite")


def test_mini_instance_speaks_the_protocol():
    eng = Engine(CFG, KVSpec(kv_bytes=8 << 20), model=build_model(CFG), name="mini0")
    inst = MiniInstance(eng, sample_every_s=0.0)
    assert isinstance(inst, EngineProtocol) and inst.kind == "mini" and inst.name == "mini0"
    assert inst.kv_pool is eng.kv.manager
    reqs = [Request(i, [(i * 5 + j) % 500 + 1 for j in range(8 + i)], 4, arrival=0.01 * i)
            for i in range(3)]
    inst.submit(reversed(reqs))
    assert inst.has_work() and inst.next_arrival() == 0.0
    inst.advance()
    assert not inst.has_work()
    m = inst.metrics()
    assert m.requests == m.finished == 3 and m.ttft.n == 3
    assert [len(s.output) for s in inst.seqs] == [4, 4, 4]
    assert [s.prompt for s in inst.seqs] == [r.prompt for r in reqs]  # admitted by arrival
    tl = inst.memory_timeline()
    assert tl and all(s.instance == "mini0" for s in tl) and max(s.used_blocks for s in tl) > 0
    eng.close()
