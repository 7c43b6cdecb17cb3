"""BlockSet (the ledger's allocated ids as a byte map) reads and changes exactly like a set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.blockset import BlockSet

N = 48

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, N - 1)),
    st.tuples(st.just("discard"), st.integers(-3, N + 3)),
    st.tuples(st.just("update"), st.lists(st.integers(0, N - 1), max_size=6)),
    st.tuples(st.just("difference_update"), st.lists(st.integers(0, N - 1), max_size=6)),
    st.tuples(st.just("run"), st.integers(0, N - 1), st.integers(0, 8)),
), max_size=40)


def _apply(bs: BlockSet, ref: set[int], op: tuple) -> None:
    kind = op[0]
    if kind == "run":  # the ledger's whole-page calls: a run all absent, or all present
        lo, hi = op[1], min(N, op[1] + op[2])
        run = set(range(lo, hi))
        if not run & ref:
            bs.add_run(lo, hi)
            ref |= run
        elif run <= ref:
            assert bs.has_run(lo, hi)
            bs.discard_run(lo, hi)
            ref -= run
        return
    getattr(bs, kind)(op[1])
    getattr(ref, kind)(op[1])


@settings(max_examples=150, deadline=None)
@given(ops)
def test_a_blockset_reads_like_the_set_it_models(script):
    bs, ref = BlockSet(N), set()
    for op in script:
        _apply(bs, ref, op)
        assert len(bs) == len(ref)
    assert list(bs) == sorted(ref)  # ascending iteration
    assert bs == ref and ref == bs and set(bs) == ref
    other = {1, 2, N + 5}
    assert bs | other == ref | other and other | bs == ref | other
    assert bs & other == ref & other
    assert bs.union(other) == ref.union(other)
    assert bs.intersection(other) == ref.intersection(other)
    assert bs.difference(other) == ref.difference(other)
    assert bs.issubset(ref | other) and bs.issuperset(ref)
    assert bs.issuperset(ref | {N + 1}) is (N + 1 in ref)
    assert bs.copy() == ref
    for b in range(-2, N + 2):
        assert (b in bs) is (b in ref)
    assert bs.has_run(0, N) is (len(ref) == N)


def test_membership_by_value_like_a_set():
    bs = BlockSet(8, [1, 2])
    assert 2.0 in bs and True in bs  # 2.0 == 2 and True == 1, as in {1, 2}
    assert 2.5 not in bs and "2" not in bs and None not in bs and -6 not in bs
    assert 8 not in bs and 100 not in bs
    assert repr(bs) == "BlockSet([1, 2])"


def test_add_refuses_a_negative_id():
    bs = BlockSet(4)
    try:
        bs.add(-1)
    except IndexError as err:
        assert "negative" in str(err)
    else:
        raise AssertionError("add(-1) wrapped around")
    assert len(bs) == 0 and list(bs) == []
