"""The real PD handover on the host backend (tiny model, VMM-backed KV on the host device):
prefill engine -> KV block copy -> decode engine gives one engine's greedy tokens, computes no
prompt token twice, frees the prefill blocks only after the copy, and leaks nothing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.errors import ConfigError  # noqa: E402
from workbench.mini.engine import Engine  # noqa: E402
from workbench.mini.kv import KVSpec  # noqa: E402
from workbench.mini.model import build_model, get_config  # noqa: E402
from workbench.pd import kvcopy  # noqa: E402
from workbench.pd.real import PDPair  # noqa: E402

CFG = get_config("tiny")
SPEC = KVSpec(backend="vmm", kv_bytes=8 << 20)  # host VMM device under the views
BS = SPEC.block_size
# around the block edges: 1 token, one short of a block, exactly one, one over, and longer
LENGTHS = (1, BS - 1, BS, BS + 1, 2 * BS, 2 * BS + 1, 100)


def _prompt(n: int, salt: int) -> list[int]:
    return [(salt * 7 + j * 13) % CFG.vocab_size for j in range(n)]


PROMPTS = [_prompt(n, i) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, "cpu")


@pytest.fixture(scope="module")
def reference(model):
    eng = Engine(CFG, SPEC, "cpu", model=model, name="colocated")
    try:
        yield lambda prompts, n: [eng.generate([p], n)[0] for p in prompts]
    finally:
        eng.close()


@pytest.fixture
def pair(model):
    p = PDPair(Engine(CFG, SPEC, "cpu", model=model, name="prefill"),
               Engine(CFG, SPEC, "cpu", model=model, name="decode"))
    yield p
    p.close()
    p.prefill.close()
    p.decode.close()


def _no_leak(pair: PDPair) -> None:
    for eng in (pair.prefill, pair.decode):
        assert eng.kv.manager.used_blocks == 0, eng.scheduler.name
        assert not eng.has_work()
        eng.kv.manager.check_invariants()
        eng.pool.check_invariants()
    assert pair.handover.pending == {}


def test_handover_gives_one_engines_tokens_one_at_a_time(pair, reference):
    want = reference(PROMPTS, 12)
    assert [pair.generate([p], 12)[0] for p in PROMPTS] == want
    assert all(len(o) == 12 for o in want)
    _no_leak(pair)


def test_handover_of_a_burst_gives_the_same_tokens(pair, reference):
    assert pair.generate(PROMPTS, 12) == reference(PROMPTS, 12)
    _no_leak(pair)


def test_no_prompt_token_is_computed_twice_and_bytes_are_whole_blocks(pair):
    pair.generate(PROMPTS, 5)
    steps = pair.decode.stats.steps
    assert steps and all(s.num_prefill_tokens == 0 for s in steps)  # decode rows only
    assert sum(s.new_tokens for s in steps) == len(PROMPTS) * 4  # tokens 2..5 of each
    assert sum(s.num_prefill_tokens for s in pair.prefill.stats.steps) == sum(LENGTHS)
    block_bytes = BS * CFG.kv_bytes_per_token
    for n, t in zip(LENGTHS, pair.times.values(), strict=True):
        blocks = -(-n // BS)
        assert (t.copy.blocks, t.copy.nbytes) == (blocks, blocks * block_bytes)
        assert t.copy.placement == "host"
        assert t.arrival <= t.prefilled <= t.copy_start <= t.copy_end <= t.released
        assert t.copy_end <= t.second_token <= t.finish


def test_prefill_blocks_are_freed_only_after_the_copy_landed(pair, monkeypatch):
    """At the moment the prefill side releases a request, the decode blocks already hold the
    same bytes as its blocks (and they are still allocated on the prefill side)."""
    seen = []
    release = pair.prefill.scheduler.release

    def checked(seq, finished):
        dst = pair._outputs[seq.name]
        n = -(-seq.prompt_len // BS)
        assert all(pair.prefill.pool.ref[b] == 1 for b in seq.blocks)
        for src_buf, dst_buf in ((pair.prefill.kv.k, pair.decode.kv.k),
                                 (pair.prefill.kv.v, pair.decode.kv.v)):
            for layer in range(CFG.num_layers):
                a = src_buf[layer][torch.tensor(seq.blocks[:n])]
                b = dst_buf[layer][torch.tensor(dst.blocks[:n])]
                assert torch.equal(a, b)
        assert pair.times[seq.name].copy is not None
        seen.append(seq.name)
        release(seq, finished)

    monkeypatch.setattr(pair.prefill.scheduler, "release", checked)
    pair.generate(PROMPTS[:4], 3)
    assert seen == [f"pd-{i}" for i in range(4)]
    _no_leak(pair)


def test_a_skipped_copy_changes_the_tokens(pair, reference, monkeypatch):
    """The equality test has teeth: with the KV left behind the decode side reads zeros."""
    monkeypatch.setattr("workbench.pd.real.copy_blocks",
                        lambda src, dst, a, b: kvcopy.CopyResult(0, 0, 0.0, "host"))
    long = [p for p in PROMPTS if len(p) > BS]
    assert pair.generate(long, 8) != reference(long, 8)
    _no_leak(pair)


def test_one_token_requests_end_on_the_prefill_side(pair, reference):
    assert pair.generate(PROMPTS[:3], 1) == reference(PROMPTS[:3], 1)
    assert all(t.copy is None for t in pair.times.values())
    assert not pair.decode.stats.steps
    _no_leak(pair)


def test_mismatched_engines_are_refused(model):
    other = get_config("tiny", num_layers=3)
    a = Engine(CFG, SPEC, "cpu", model=model, name="a")
    b = Engine(other, SPEC, "cpu", name="b")
    try:
        with pytest.raises(ConfigError, match="same model config and block size"):
            PDPair(a, b)
        with pytest.raises(ConfigError, match="one engine for both roles"):
            PDPair(a, a)
    finally:
        a.close()
        b.close()


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 3 * BS + 2), min_size=1, max_size=3),
       max_tokens=st.integers(1, 6))
def test_any_prompt_lengths_hand_over_exactly(pair, reference, lengths, max_tokens):
    prompts = [_prompt(n, 3 + i) for i, n in enumerate(lengths)]
    assert pair.generate(prompts, max_tokens) == reference(prompts, max_tokens)
    _no_leak(pair)


def test_a_failed_copy_frees_both_sides_and_falls_back_to_recompute(pair, reference,
                                                                     monkeypatch):
    def broken(*args):
        raise RuntimeError("copy engine fault")

    monkeypatch.setattr("workbench.pd.real.copy_blocks", broken)
    with pytest.raises(RuntimeError, match="copy engine fault"):
        pair.generate(PROMPTS[5:6], 4)
    assert pair.prefill.kv.manager.used_blocks == pair.decode.kv.manager.used_blocks == 0
    assert pair.handover.pending == {}
    (seq,) = pair.decode.scheduler.waiting
    assert (seq.blocks, seq.num_computed) == ([], 0)
    while pair.has_work():  # stepping on: the decode side computes prompt + first token itself
        pair.step()
    assert seq.output == reference(PROMPTS[5:6], 4)[0]
    assert sum(s.num_prefill_tokens for s in pair.decode.stats.steps) == len(PROMPTS[5]) + 1
    _no_leak(pair)


def test_close_frees_sources_still_waiting_for_their_copy(pair):
    pair.submit(PROMPTS[3], 4)
    pair.prefill.step()
    pair._hand_over()  # handed over, not yet admitted by the decode engine
    assert len(pair.handover.pending) == 1 and pair.prefill.kv.manager.used_blocks == 2
    pair.close()
    _no_leak(pair)
