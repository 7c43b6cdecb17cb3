"""Two OS processes, one GPU, a pool each: one's growth lowers the other's headroom, and a limit
written by `workbench kvctl` from a third process takes effect in the owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.units import GiB, MiB

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
# 8 layers x K,V x 2 MiB: a 32 MiB page id; 32 KiB blocks, 64 per page; 6 GiB of capacity
GEO = dict(num_layers=8, kv_heads=8, head_dim=128, block_size=16, num_blocks=64 * 192)


def _env() -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path)


class Owner:
    def __init__(self):
        worker = str(Path(__file__).with_name("_pool_worker.py"))
        self.p = subprocess.Popen([sys.executable, worker], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)

    def __call__(self, cmd: str, **kw) -> dict:
        self.p.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died on {cmd}: exit {self.p.wait()}")
        return json.loads(line)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self("quit")
            finally:
                self.p.wait(timeout=30)


@pytest.fixture
def owners(cuda_dev):  # cuda_dev: skip cleanly where there is no usable CUDA device
    made: list[Owner] = []
    yield lambda: made.append(Owner()) or made[-1]
    for o in made:
        o.close()


def test_growth_in_one_process_lowers_the_others_headroom(owners):
    a, b = owners(), owners()
    sa = a("open", **GEO)
    sb = b("open", headroom=4 * GiB, **GEO)  # B may use at most 4 GiB more of the device
    bpp = 64
    assert sb["available"] <= (4 * GiB // (32 * MiB)) * bpp + bpp
    before = b("poll")["available"]
    got = a("alloc", n=64 * 64)  # A grows by 64 page ids: 2 GiB
    assert got["got"] == 64 * 64 and got["mapped"] >= 2 * GiB
    after = b("poll")["available"]
    drop_pages = (before - after) / bpp
    assert 60 <= drop_pages <= 68, (before, after)  # B sees A's 2 GiB as lost headroom
    a("free_all")
    assert b("poll")["available"] >= before - bpp  # and gets it back when A shrinks
    assert sa["mapped"] == 32 * MiB  # only the null block's page at the start


def test_kvctl_limit_from_a_third_process(owners):
    name = f"wbgpu{os.getpid()}"
    a = owners()
    a("open", ipc_name=name, **GEO)
    st = a("alloc", n=64 * 8)
    assert st["mapped"] >= 8 * 32 * MiB
    out = subprocess.run([sys.executable, "-m", "workbench", "kvctl", "limit", name, "64MiB",
                          "--wait", "0", "--json"], capture_output=True, text=True, env=_env(),
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    st = a("poll")  # the owner applies it on its next alloc/free
    assert st["limit"] == 64 * MiB and st["outcome"] == "deferred"  # live blocks are never revoked
    free_before = st["free"]
    st = a("free_all")
    assert st["outcome"] == "applied" and st["mapped"] <= 64 * MiB
    assert st["free"] >= free_before + 6 * 32 * MiB  # the shrink gave the device memory back
    st = a("alloc", n=64 * 4)
    assert st["got"] is None  # the new limit holds: 2 page ids at most
