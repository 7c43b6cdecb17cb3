"""The tier model's invariants: capacity is never exceeded, a hit implies the whole prefix chain
is present, LRU evicts the least recently used chunk (a chain's tail before its head), and the
costs follow the tier each chunk came from."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.tiers import RemoteStore, Tier, TierSpec, TierStack, chunk_keys, content_keys

C, KVB = 4, 10  # tokens per chunk, bytes per token: a chunk is 40 bytes
CB = C * KVB


def stack(hbm: int, dram: int, remote: int) -> TierStack:
    tiers = [Tier(TierSpec("hbm", hbm * CB, on_device=True), CB),
             Tier(TierSpec("dram", dram * CB, lookup_s=1e-5), CB),
             RemoteStore(TierSpec("remote", remote * CB, lookup_s=1e-3, read_bw=1e3,
                                  write_bw=1e3, op_s=1e-2), CB)]
    return TierStack(tiers, chunk_tokens=C, kv_bytes_per_token=KVB, pcie_bw=1e4,
                     pcie_op_s=1e-3)


# prompts from a 2-token alphabet and a few prefixes, so chains share heads often
prompts = st.lists(st.sampled_from([1, 2]), min_size=1, max_size=6).map(
    lambda xs: [t for x in xs for t in [x] * C] + [9])
ops = st.lists(st.tuples(st.sampled_from(["save", "retrieve"]), prompts), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 3), st.integers(0, 4), st.integers(0, 6))
def test_capacity_never_exceeded_and_hits_are_whole_chains(seq, h, d, r):
    s = stack(h, d, r)
    for op, tokens in seq:
        if op == "save":
            s.save(tokens)
        else:
            keys = chunk_keys(tokens, C)
            plan = s.plan(tokens)
            n = plan.hit_tokens // C
            assert all(s.where(k) is not None for k in keys[:n])  # the whole chain is present
            if n < len(keys):
                assert s.where(keys[n]) is None  # it stopped at the first absent chunk
            got = s.retrieve(tokens)
            assert got.hit_tokens == plan.hit_tokens and got.chunks == plan.chunks
            assert sum(got.chunks.values()) == n
        for t in s.tiers:
            assert len(t) <= max(t.capacity_chunks, 0)
            assert t.used_bytes <= t.spec.capacity_bytes


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=4), max_size=30),
       st.integers(1, 5))
def test_lru_evicts_the_least_recently_used(chains, cap):
    t = Tier(TierSpec("dram", cap * CB), CB)
    ref: list[int] = []  # reference model: oldest first
    for chain in chains:
        chain = list(dict.fromkeys(chain))
        expect_evicted = []
        for k in reversed(chain):  # the tail goes in first, the head ends newest
            if k in ref:
                ref.remove(k)
            elif len(ref) >= cap:
                expect_evicted.append(ref.pop(0))
            ref.append(k)
        assert t.put(chain) == expect_evicted
        assert list(t.lru) == ref


def test_a_chain_loses_its_tail_before_its_head():
    t = Tier(TierSpec("dram", 3 * CB), CB)
    t.put([10, 11, 12])
    assert t.victim() == 12
    assert t.put([20]) == [12]
    assert list(t.lru) == [11, 10, 20]


def test_an_early_change_breaks_every_later_chunk():
    base = list(range(1, 4 * C + 2))
    changed = list(base)
    changed[C + 1] = 999  # inside the second chunk
    assert chunk_keys(base, C)[:1] == chunk_keys(changed, C)[:1]
    assert not set(chunk_keys(base, C)[1:]) & set(chunk_keys(changed, C))
    # position-free keys still match the untouched later chunks
    assert content_keys(base, C)[2:] == content_keys(changed, C)[2:]
    s = stack(0, 8, 0)
    s.save(base)
    assert s.plan(changed).hit_tokens == C


def test_costs_follow_the_source_tier():
    tokens = [1] * (3 * C) + [2]
    s = stack(0, 0, 8)  # only the store holds it
    s.save(tokens)
    r = s.retrieve(tokens)
    assert r.chunks == {"remote": 3}
    assert r.metadata_requests == 1 and r.payload_bytes == 3 * CB
    assert math.isclose(r.lookup_s, 1e-5 + 1e-3)  # dram asked first, then the master
    assert math.isclose(r.retrieve_s, 3 * (1e-2 + CB / 1e3))
    assert math.isclose(r.h2d_s, 3 * (1e-3 + CB / 1e4))
    again = s.retrieve(tokens)  # promoted into dram and hbm (capacity 0 for both here)
    assert again.chunks == {"remote": 3}
    s2 = stack(4, 4, 8)
    s2.save(tokens)
    r2 = s2.retrieve(tokens)
    assert r2.chunks == {"hbm": 3} and r2.h2d_s == 0 and r2.payload_bytes == 0


def test_skip_moves_only_what_the_engine_lacks_and_one_token_is_computed():
    tokens = [3] * (4 * C)  # exactly four chunks: the last one is never retrieved
    s = stack(0, 8, 0)
    s.save(tokens)
    assert s.plan(tokens).hit_tokens == 3 * C
    r = s.retrieve(tokens, skip_tokens=2 * C)
    assert r.new_tokens == C and r.chunks == {"dram": 1}


def test_cross_instance_reads_are_counted():
    store = RemoteStore(TierSpec("remote", 8 * CB, lookup_s=1e-3, read_bw=1e3, write_bw=1e3), CB)
    a = TierStack([store], chunk_tokens=C, kv_bytes_per_token=KVB, owner="a")
    b = TierStack([store], chunk_tokens=C, kv_bytes_per_token=KVB, owner="b")
    tokens = [5] * (2 * C) + [1]
    a.save(tokens)
    assert b.retrieve(tokens).cross_instance_chunks == 2
    assert a.retrieve(tokens).cross_instance_chunks == 0
    assert store.metadata_requests == 3 and store.payload_read == 4 * CB
