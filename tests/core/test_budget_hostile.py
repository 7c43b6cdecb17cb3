"""A budget file that is not one this workbench wrote is refused in one line and left alone."""

from __future__ import annotations

import os
import struct

import hypothesis.strategies as st
import pytest
from hypothesis import given
from hypothesis import settings as hsettings

from workbench.backends import make_device
from workbench.core import budget_segment as bs
from workbench.core.budget_device import (
    BudgetedDevice,
    budgeted,
    instance_capacity,
    split_evenly,
)
from workbench.errors import ConfigError, DeviceError

MiB = 1 << 20
TOTAL = 64 * MiB


def _good(tmp_path) -> bytes:
    bs.SharedBudget.open("host", TOTAL, shm_dir=tmp_path).close()
    return bs.budget_path("host", tmp_path).read_bytes()


def _wrong_magic(raw: bytes) -> bytes:
    return b"NOTABUD\x00" + raw[8:]


def _wrong_version(raw: bytes) -> bytes:
    return raw[:8] + struct.pack("<I", 99) + raw[12:]


def _short(raw: bytes) -> bytes:
    return raw[:-1]


def _long(raw: bytes) -> bytes:
    return raw + b"\x00"


def _empty(raw: bytes) -> bytes:
    return b""


def _bad_slot(raw: bytes) -> bytes:
    return raw[:bs.HEAD.size] + bs.SLOT.pack(-5, 0, 1) + raw[bs.HEAD.size + bs.SLOT.size:]


def _zero_total(raw: bytes) -> bytes:
    return raw[:16] + struct.pack("<q", 0) + raw[24:]


CORRUPT = {"wrong magic": (_wrong_magic, "no budget magic"),
           "other version": (_wrong_version, "budget version 99"),
           "one byte short": (_short, "need exactly"),
           "one byte long": (_long, "need exactly"),
           "empty": (_empty, "shorter than"),
           "negative pid": (_bad_slot, "slot 0"),
           "zero total": (_zero_total, "out of range")}


def _refused(tmp_path, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as got:
        budgeted(make_device("host"), TOTAL, shm_dir=tmp_path)
    assert "\n" not in str(got.value) and "Fix:" in str(got.value)


def _left_alone(tmp_path, before: dict[str, bytes]) -> None:
    after = {p.name: (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
             for p in tmp_path.iterdir()}
    assert after == before  # nothing written, nothing added (no half-created file either)


def _snapshot(tmp_path) -> dict[str, bytes]:
    return {p.name: (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in tmp_path.iterdir()}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_corrupt_budget_is_refused_and_unchanged(tmp_path, case):
    corrupt, match = CORRUPT[case]
    path = bs.budget_path("host", tmp_path)
    path.write_bytes(corrupt(_good(tmp_path)))
    before = _snapshot(tmp_path)
    _refused(tmp_path, match)
    _left_alone(tmp_path, before)


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    os.symlink(target, bs.budget_path("host", tmp_path))
    before = _snapshot(tmp_path)
    _refused(tmp_path, "symbolic link")
    _left_alone(tmp_path, before)
    assert target.read_bytes() == b"precious"


def test_another_users_budget_is_refused(tmp_path, monkeypatch):
    raw = _good(tmp_path)
    path = bs.budget_path("host", tmp_path)
    if os.getuid() == 0:
        os.chown(path, 4242, 4242)
    else:  # not root: the file is ours, so this process pretends to be someone else
        monkeypatch.setattr(os, "getuid", lambda: 4242 + 1)
    _refused(tmp_path, "owned by uid")
    assert path.read_bytes() == raw


def test_a_fifo_or_directory_is_refused_without_blocking(tmp_path):
    path = bs.budget_path("host", tmp_path)
    os.mkfifo(path)
    _refused(tmp_path, "FIFO")
    path.unlink()
    path.mkdir()
    _refused(tmp_path, "directory")


def test_a_total_that_differs_from_a_live_holders_is_refused(tmp_path):
    b = bs.SharedBudget.open("host", TOTAL, shm_dir=tmp_path)
    assert b.charge(2 * MiB)
    with pytest.raises(ConfigError, match="same WORKBENCH_KV_GPU_BUDGET"):
        bs.SharedBudget.open("host", 2 * TOTAL, shm_dir=tmp_path)
    b.credit(2 * MiB)  # nobody holds bytes: a new total is adopted
    bs.SharedBudget.open("host", 2 * TOTAL, shm_dir=tmp_path).close()
    assert b.state().total == 2 * TOTAL
    b.close()


def test_a_budget_corrupted_after_opening_turns_charges_into_misses(tmp_path):
    dev = budgeted(make_device("host"), TOTAL, shm_dir=tmp_path)
    path = bs.budget_path("host", tmp_path)
    with open(path, "r+b") as f:
        f.write(b"XXXXXXXX")
    with pytest.raises(DeviceError, match="out of the GPU budget"):
        dev.create(2 * MiB)
    assert dev.inner.allocated_bytes == 0  # refused before the inner device was touched


def test_make_device_charges_to_the_budget_it_is_given(tmp_path, monkeypatch):
    monkeypatch.setattr(bs.segment, "SHM_DIR", tmp_path)
    dev = make_device("host", gpu_budget=4 * MiB)
    assert isinstance(dev, BudgetedDevice)
    assert dev.mem_info().total == 4 * MiB
    h = dev.create(2 * MiB)
    assert dev.mem_info().free == 2 * MiB
    with pytest.raises(DeviceError):
        dev.create(4 * MiB)
    dev.release(h)
    assert dev.mem_info().free == 4 * MiB and dev.budget.state().holders == {}
    assert not isinstance(make_device("host", gpu_budget=0), BudgetedDevice)
    assert not isinstance(make_device("sim", gpu_budget=4 * MiB), BudgetedDevice)


def test_the_static_baseline_gets_the_same_total_split_evenly():
    total = 80 * 1024 * MiB
    share = split_evenly(total, 3, 2 * MiB)
    assert share % (2 * MiB) == 0 and 3 * share <= total < 3 * (share + 2 * MiB)
    with pytest.raises(ValueError):
        split_evenly(total, 0, 2 * MiB)


def test_static_and_elastic_see_the_same_memory(tmp_path):
    """Both modes read the device's memory: on a budgeted device that is the budget, so two
    static instances get half of it each and the elastic pools share all of it."""
    dev = budgeted(make_device("host"), TOTAL, shm_dir=tmp_path)
    assert instance_capacity(dev, 2) == TOTAL // 2
    assert instance_capacity(dev, 3) * 3 <= dev.mem_info().free == TOTAL


def test_the_knob_is_parsed_like_the_other_sizes(tmp_path, monkeypatch):
    from workbench.settings import settings

    assert settings({}).gpu_budget == 0
    assert settings({"WORKBENCH_KV_GPU_BUDGET": "0"}).gpu_budget == 0
    assert settings({"WORKBENCH_KV_GPU_BUDGET": "80GiB"}).gpu_budget == 80 << 30
    for bad in ("3MiB", "-2MiB", "lots", "2PiB"):
        with pytest.raises(ConfigError) as got:
            settings({"WORKBENCH_KV_GPU_BUDGET": bad})
        assert str(got.value).startswith(f"WORKBENCH_KV_GPU_BUDGET={bad!r}")
        assert "\n" not in str(got.value)
    monkeypatch.setattr(bs.segment, "SHM_DIR", tmp_path)
    monkeypatch.setenv("WORKBENCH_KV_GPU_BUDGET", "8MiB")
    dev = make_device("host")
    assert isinstance(dev, BudgetedDevice) and dev.mem_info().total == 8 * MiB
    assert bs.budget_path("host", tmp_path).exists()


def _mutate(edits: list[tuple[int, int]]) -> bytes:
    raw = bytearray(_GOOD)
    for at, byte in edits:
        raw[at] = byte
    return bytes(raw)


_GOOD = bs.HEAD.pack(bs.MAGIC, bs.VERSION, bs.HEAD.size, TOTAL, 4, 1) + bytes(4 * bs.SLOT.size)


@given(st.one_of(st.binary(max_size=400),
                 st.lists(st.tuples(st.integers(0, len(_GOOD) - 1), st.integers(0, 255)),
                          min_size=1, max_size=8).map(_mutate)))
@hsettings(max_examples=300, deadline=None)
def test_budget_bytes_never_raise_but_the_refusal(data):
    try:
        state = bs.parse(data, "fuzz")
    except bs.SegmentRefused as err:
        assert "\n" not in str(err)
        return
    assert 0 < state.total and 0 <= state.held and len(data) == bs.file_size(state.slots)
