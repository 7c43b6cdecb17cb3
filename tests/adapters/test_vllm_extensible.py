"""The 0.34 plan's ``ElasticTensor`` engine-free, on the host device: vLLM's segment placement
bound to a ledger at one base, prefix commits as bookkeeping, pages following held blocks, and
the one-line refusals (vLLM itself: ``tests/engines_real/vllm034``)."""

from __future__ import annotations

import pytest

from workbench.adapters.vllm import registry
from workbench.adapters.vllm.extensible import ElasticTensor, make_allocate, make_measure
from workbench.errors import ConfigError
from workbench.units import MiB

torch = pytest.importorskip("torch")
STRIDE = 8192  # one block of one layer (vLLM's page_size_bytes for 16 tokens x 2 x 64 fp16)
BLOCKS = 1024  # 8 MiB a layer: 4 pages of 2 MiB


@pytest.fixture
def host_env(monkeypatch, tmp_path):
    for k in ("GPU_BUDGET", "MIN_RESERVED_PAGES", "MAX_RESERVED_PAGES"):
        monkeypatch.setenv(f"WORKBENCH_KV_{k}", "0")
    monkeypatch.setenv("WORKBENCH_KV_SHM_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "ledgers", [])


def _tensor(layers: int = 2, region: int = BLOCKS * STRIDE) -> ElasticTensor:
    return ElasticTensor(layers * region, device="cpu", segment_capacities=[region] * layers)


class Cache:
    """The parts of vLLM's ExtensibleKVCache its ``allocate`` reads."""

    def __init__(self, buffer, capacity_blocks=BLOCKS, strides=(STRIDE, STRIDE)):
        self.buffer, self.capacity_blocks, self.segment_strides = buffer, capacity_blocks, strides
        self.size = buffer.capacity_bytes

    def allocate(self, size):  # vLLM's: commit the null block, hand out the full view
        self.buffer.resize_segments_([STRIDE] * len(self.segment_strides), zero_new=True)
        return self.buffer.full_view()


def test_the_hook_binds_a_ledger_at_vllms_offsets_and_commits_map_nothing(host_env):
    t = _tensor()
    view = make_allocate(Cache.allocate)(Cache(t), t.capacity_bytes)
    kv = t.ledger
    assert registry.ledger_for(BLOCKS) is kv
    assert view.data_ptr() == kv.space.base == t.base_ptr and view.numel() == 16 * MiB
    assert t.segment_offsets == [0, 8 * MiB] and t.num_bytes == 2 * STRIDE
    assert t.physical_bytes == kv.mapped_bytes == 4 * MiB  # the null block's page id only
    t.resize_segments_([BLOCKS * STRIDE] * 2)  # vLLM's final commit: bookkeeping
    assert t.physical_bytes == 4 * MiB and t.segment_view(1).numel() == BLOCKS * STRIDE
    kv.hold(range(256, 300))  # the pool holds blocks on page 1: it is mapped, in both layers
    assert t.physical_bytes == 8 * MiB
    view[8 * MiB + 256 * STRIDE] = 5  # layer 1, block 256
    assert int(t.segment_view(1)[256 * STRIDE]) == 5
    kv.release(range(256, 300))
    assert t.physical_bytes == 4 * MiB
    t.free()
    assert kv.closed


def test_a_placement_off_the_pages_is_refused_in_one_line(host_env):
    region = BLOCKS * STRIDE + 4096  # padded to 4 KiB, not to the 2 MiB page
    t = _tensor(region=region)
    with pytest.raises(ConfigError) as err:
        t.bind(BLOCKS, [STRIDE, STRIDE])
    assert "\n" not in str(err.value) and "WORKBENCH_KV_PAGE_SIZE" in str(err.value)
    assert t.ledger is None and registry.ledgers == []


@pytest.mark.parametrize(("what", "call"), [
    ("exported", lambda: ElasticTensor(4 * MiB, "cpu", export_handle_types=1)),
    ("strides", lambda: _tensor().bind(BLOCKS, [STRIDE, 2 * STRIDE])),
    ("unbound", lambda: _tensor().full_view()),
    ("rdma", lambda: _tensor().segments_backed_by_one_chunk([0, 0])),
])
def test_what_the_elastic_tensor_cannot_serve_is_refused(host_env, what, call):
    with pytest.raises(ConfigError) as err:
        call()
    assert "\n" not in str(err.value) and "WORKBENCH_KV_AUTOPATCH" in str(err.value), what


def test_a_commit_past_a_segment_is_vllms_value_error(host_env):
    t = _tensor()
    with pytest.raises(ValueError, match="do not fit"):
        t.resize_segments_([BLOCKS * STRIDE + 1, 0])
    with pytest.raises(ValueError, match="do not fit"):
        t.resize_segments_([0])


def test_sizing_keeps_an_elastic_caches_capacity_and_measures_a_stock_one():
    measured = []
    measure = make_measure(lambda cache, *a, **k: measured.append(cache) or 7)
    elastic = Cache.__new__(Cache)
    elastic.buffer, elastic.capacity_blocks = _tensor(), BLOCKS
    stock = type("Stock", (), {"buffer": object()})()
    assert measure(elastic, None, "cpu", init_free_memory=0, requested_memory=0) == BLOCKS
    assert measure(stock, None, "cpu", init_free_memory=0, requested_memory=0) == 7
    assert measured == [stock]
