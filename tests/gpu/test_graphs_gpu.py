"""Decode CUDA graphs on a GPU: greedy tokens with graphs equal those without, for VMM and static
KV, block and token layouts, with padded batches and with pages mapped and unmapped between
replays."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.attention import triton_available  # noqa: E402
from workbench.mini.engine import Engine, EngineConfig  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402

if torch.cuda.is_available() and not triton_available(torch.device("cuda")):
    pytest.skip("decode graphs capture the Triton kernel", allow_module_level=True)

CFG = get_config("tiny", hidden_size=512, num_layers=4, q_heads=8, kv_heads=2,
                 head_dim=64, intermediate_size=1024, vocab_size=4096)
# 11 requests finishing at different steps: decode batches of 11, 10, ..., 1, most padded
PROMPTS = [[(i * 31 + j * 17) % 4096 for j in range(5 + i * 23)] for i in range(11)]
GENS = [6 + 3 * i for i in range(11)]
SIZES = (1, 2, 4, 8, 16)
# 8 KV heads of 128: a 2 MiB page of one layer's buffer holds 1024 tokens, so both layouts
# spread one wave over several page ids (and unmap them when it ends)
WIDE = get_config("tiny", hidden_size=512, num_layers=4, q_heads=8, kv_heads=8,
                  head_dim=128, intermediate_size=1024, vocab_size=4096)


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, "cuda")


@pytest.fixture(scope="module")
def wide_model():
    return build_model(WIDE, "cuda")


def _engine(model, style, backend, graphs, cfg=CFG, kv_bytes=64 << 20, **spec) -> Engine:
    bs = 16 if style == "block" else 1
    kv = KVSpec(style=style, backend=backend, kv_bytes=kv_bytes, block_size=bs, **spec)
    return Engine(cfg, kv, "cuda", EngineConfig(cuda_graphs=graphs, graph_sizes=SIZES),
                  model=model)


def _generate(eng: Engine, prompts, gens) -> tuple[list[list[int]], int]:
    """Greedy outputs, and the most bytes mapped at any step."""
    seqs = [eng.add_request(p, n) for p, n in zip(prompts, gens, strict=True)]
    peak = 0
    while eng.has_work():
        eng.step()
        peak = max(peak, eng.kv.manager.mapped_bytes)
    return [list(s.output) for s in seqs], peak


@pytest.mark.parametrize("style", ["block", "token"])
@pytest.mark.parametrize("backend", ["static", "vmm"])
def test_graphs_give_the_eager_tokens_with_padded_batches(model, style, backend):
    eager = _engine(model, style, backend, graphs=False)
    ref, _ = _generate(eager, PROMPTS, GENS)
    eager.close()
    eng = _engine(model, style, backend, graphs=True)
    out, _ = _generate(eng, PROMPTS, GENS)
    assert out == ref
    graphed = [s for s in eng.stats.steps if s.graphed]
    assert {s.num_decode for s in graphed} == set(range(1, 12))  # 3, 5..7, 9..11 are padded
    assert eng.graphs.captured == SIZES and eng.graphs.replays == len(graphed)
    eng.close()


@pytest.mark.parametrize("style", ["block", "token"])
def test_graphs_replay_across_page_unmaps_and_maps(wide_model, style):
    """No reserve: every freed page is unmapped at once, and the second wave maps pages again
    under graphs captured during the first."""
    runs = {}
    for graphs in (False, True):
        eng = _engine(wide_model, style, "vmm", graphs, WIDE, 256 << 20, min_reserved_pages=0,
                      max_reserved_pages=0)
        first, peak1 = _generate(eng, PROMPTS, GENS)
        between = eng.kv.manager.mapped_bytes
        replays = eng.graphs.replays if graphs else 0
        second, peak2 = _generate(eng, PROMPTS[::-1], GENS)
        assert between < peak1 and between < peak2  # pages went and came back
        if graphs:
            assert eng.graphs.captured == SIZES and eng.graphs.replays > replays > 0
        runs[graphs] = (first, second)
        eng.close()
    assert runs[True] == runs[False]


def test_graphs_refuse_the_torch_attention_path(model):
    with pytest.raises(ConfigError, match="only the Triton decode kernel can be captured"):
        Engine(CFG, KVSpec(kv_bytes=16 << 20), "cuda",
               EngineConfig(cuda_graphs=True, attn_impl="torch"), model=model)


def test_graphs_are_on_by_default_on_cuda(model):
    eng = Engine(CFG, KVSpec(kv_bytes=16 << 20), "cuda", EngineConfig(max_num_seqs=8),
                 model=model)
    assert eng.graphs is not None and eng.graphs.captured == (1, 2, 4, 8)
    eng.close()
