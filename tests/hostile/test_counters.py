"""A segment whose counters sit anywhere in int64 (the maximum included): every reader either
refuses it in one line or draws it within its width (``kvtop`` never a ``MemoryError``), and
``kvctl limit`` refuses before it writes a byte (never half a request, never ``struct.error``)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests.hostile.test_shm import ME, MY_START, cli, seg_bytes
from workbench.cli.kvtop import render_pool
from workbench.core import control, segment

I64 = st.integers(-(1 << 63), (1 << 63) - 1)
EXTREMES = st.sampled_from([0, 1, (1 << 62) - 1, 1 << 62, (1 << 62) + 1, (1 << 63) - 1])
COUNTERS = [f for f in segment.FIELDS if f not in ("owner_pid", "owner_start", "num_pages",
                                                   "capacity", "page_id_bytes")]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(COUNTERS), I64 | EXTREMES, max_size=6),
       st.integers(1, 3))
def test_every_counter_value_is_refused_in_one_line_or_drawn_within_the_width(over, pages):
    over.setdefault("outcome", 0)
    over.setdefault("ack_outcome", 0)
    try:
        v, codes = segment.parse(bytes(seg_bytes(ME, MY_START, pages, **over)))
    except segment.SegmentRefused as err:
        assert "\n" not in str(err)
        return
    info = control.SegmentInfo.of("x", v, codes)
    con = Console(record=True, width=120)
    con.print(render_pool(info, width=40))
    assert max(len(line) for line in con.export_text().splitlines()) <= 120


@pytest.fixture
def planted():
    made = []

    def plant(**over) -> tuple[str, bytes]:
        name = f"hc_{uuid.uuid4().hex[:10]}"
        data = bytes(seg_bytes(ME, MY_START, 4, **over))
        control.segment_path(name).write_bytes(data)
        made.append(control.segment_path(name))
        return name, data

    yield plant
    for p in made:
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("over, why", [
    ({"revision": (1 << 63) - 1}, "past any counter"),
    ({"req_revision": (1 << 63) - 1, "ack_revision": (1 << 63) - 1}, "past any counter"),
    ({"used": (1 << 63) - 1, "reserved": (1 << 63) - 1}, "past any counter"),
    ({"used": (1 << 62)}, "more than the capacity"),
    ({"revision": 1 << 62}, "used up its request revisions"),
])
def test_kvctl_limit_refuses_before_writing_and_readers_stay_calm(planted, over, why):
    name, data = planted(**over)
    r = cli("kvctl", "limit", name, "4MiB", "--wait", "0")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and why in r.stderr, r.stderr
    assert control.segment_path(name).read_bytes() == data  # not a byte written
    for args in (["kvtop", "--once"], ["kvctl", "list"], ["kvctl", "list", "--json"]):
        r = cli(*args)
        assert r.returncode == 0 and "Traceback" not in r.stderr + r.stdout, r.stderr
