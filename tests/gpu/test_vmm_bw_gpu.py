"""The bandwidth probe on a CUDA GPU: every backing plan maps distinct physical memory under each
region, and one small probe reports every subject and kernel."""

from __future__ import annotations

import pytest

from workbench.bench import vmm_bw_probe as probe
from workbench.bench.vmm_bw_plan import PIECE, VARIANTS, plan
from workbench.errors import DeviceError

pytestmark = pytest.mark.gpu
OFFSET_MAPS = ("hpage", "hregion_2m")  # refused on an H200 (driver of CUDA 13), 2026-12-01


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_plan_backs_every_region_with_its_own_memory(variant, cuda_dev, torch_mod):
    torch = torch_mod
    from workbench.gpu.tensors import from_pointer

    regions, pages = 4, 8
    region = pages * PIECE
    try:
        rb = probe.RawBacking(plan(variant, regions, pages), regions * region)
    except DeviceError as err:  # a mapping at a non-zero offset into a handle
        if variant in OFFSET_MAPS and err.code == "CUDA_ERROR_NOT_SUPPORTED":
            pytest.skip(f"this driver maps whole handles only: {err}")
        raise
    try:
        whole = from_pointer(rb.base, rb.total).view(torch.float32)
        n = region // 4
        for i in range(regions):  # a region aliasing another would be overwritten here
            whole[i * n:(i + 1) * n].fill_(float(i + 1))
        torch.cuda.synchronize()
        for i in range(regions):
            part = whole[i * n:(i + 1) * n]
            assert part.min().item() == part.max().item() == float(i + 1)
        del whole, part
    finally:
        torch.cuda.synchronize()
        assert len(rb.close()) == len(rb.handles)


def test_a_small_probe_reports_every_subject_and_kernel(cuda_dev, torch_mod):
    names = ("plain_each", "plain_packed", "wb", "wb_contig64", "wb_p8", "h2m_page", "hchunk4")
    res = probe.probe(4, names, ("add", "copy"), repeats=2, reps=2)
    assert res["skipped"] == {}
    assert set(res["kernels"]) == {"add", "copy"}
    for kr in res["kernels"].values():
        assert set(kr["subjects"]) == set(names)
        ref = kr["subjects"][probe.REF]
        assert ref["ratios"] == [1.0, 1.0]
        assert all(s["ratio"]["n"] == 2 for s in kr["subjects"].values())
    assert res["kernels"]["add"]["bytes_moved"] == 2 * probe.REGIONS * 4 * PIECE
    assert res["kernels"]["copy"]["bytes_moved"] == probe.REGIONS * 4 * PIECE
    assert res["grow_us_per_page_id"]["h2m_page"]["n"] == 4
    assert res["shrink_us_per_page_id"]["hchunk4"]["n"] == 1
    assert res["page_id_MiB"] == {"h2m_page": 128, "hchunk4": 512}


def test_the_bench_times_every_pairing_like_for_like(cuda_dev, torch_mod):
    from workbench.bench.vmm_bw import bandwidth

    bw = bandwidth(gib=1, repeats=2, reps=2)
    launches = {n: r["launches"] for n, r in bw["pairings"].items()}
    assert launches == {"contiguous_sum": 1, "contiguous_add": 1, "per_layer_sum": 64,
                        "per_layer_add": 64, "per_layer_8MiB_sum": 64, "per_layer_8MiB_add": 64}
    assert all(r["ratio"]["n"] == 2 for r in bw["pairings"].values())
    assert bw["pairings"]["per_layer_8MiB_add"]["bytes_moved"] == 2 * (1 << 30)
