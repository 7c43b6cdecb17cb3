"""pd-split on host: the real handover between two mini engines against one colocated engine
(tiny model); the gpu backend's refusals, checked without a GPU."""

from __future__ import annotations

import pytest

from tests.labs.cli import run_lab_cli
from workbench.backends import probe
from workbench.errors import ConfigError
from workbench.labs import get_lab, run_lab

pytest.importorskip("torch")

LENS = (1, 16, 17, 300)


@pytest.fixture(scope="module")
def host():
    lab = get_lab("pd-split")
    return run_lab("pd-split", lab.params(real_prompt_lens=LENS, real_max_tokens=6), "host")


def test_host_run_gives_equal_tokens_and_whole_block_transfers(host):
    rows = host.tables["handover"]
    assert [r["prompt_len"] for r in rows] == list(LENS)
    block = host.record.results["real"]["block_bytes"]
    assert block == 16 * 512  # tiny: 2 layers x K,V x 2 kv heads x 32 dims x 2 bytes, 16 tokens
    for r in rows:
        assert r["tokens_equal"] and r["output_len"] == 6
        assert r["blocks"] == -(-r["prompt_len"] // 16)
        assert r["transfer_bytes"] == r["blocks"] * block > 0
        assert r["copy"] == "host"
        p = r["pd_ms"]
        assert p["ttft"] == pytest.approx(p["prefill"] + p["decode_wait"] + p["transfer"],
                                          abs=2e-3)
        assert min(p["prefill"], p["transfer"], p["decode_wait"], p["first_decode_step"]) >= 0
    assert [r["first"] for r in rows] == ["colocated", "pd", "colocated", "pd"]
    s = host.record.results["summary"]
    assert s["tokens_equal"] and s["bytes_are_blocks_x_block_bytes"]
    assert s["transfer_bytes"] == sum(r["transfer_bytes"] for r in rows)
    assert s["leaked_blocks"] == 0
    assert host.record.verdict.startswith("supported")
    assert host.record.environment["pd_and_colocated_share_a_device"] is True


def test_host_markdown_says_what_it_shows(host):
    md = host.markdown
    assert "**Tokens equal** (PD vs colocated, greedy): yes." in md
    assert "share one device here" in md and "not PD's performance advantage" in md
    assert md.count("| yes |") == len(LENS)


def test_quick_runs_the_first_two_lengths_through_the_cli(tmp_path):
    d = run_lab_cli(tmp_path / "pd.json", "pd-split", "--backend", "host", quick="true",
                    real_prompt_lens="20,40,60", real_max_tokens="3")
    assert [r["prompt_len"] for r in d["results"]["real"]["rows"]] == [20, 40]
    assert d["results"]["summary"]["tokens_equal"] is True


def test_gpu_refusals_come_before_anything_runs(monkeypatch):
    import workbench.labs.pd_split.real as real

    lab = get_lab("pd-split")
    monkeypatch.setattr(real, "cuda_device_count", lambda: 1)
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)  # a GPU here
    with pytest.raises(ConfigError, match=r"this host shows 1.*--param gpus=1"):
        lab.run(lab.params(), "gpu")
    with pytest.raises(ConfigError, match=r"gpus=3: outside 1..2"):  # its declared range
        lab.run(lab.params(gpus=3), "gpu")
    assert real.placement("gpu", 1).shared and real.placement("gpu", 1).decode == "cuda:0"
    monkeypatch.setattr(real, "cuda_device_count", lambda: 2)
    two = real.placement("gpu", 2)
    assert (two.prefill, two.decode, two.shared) == ("cuda:0", "cuda:1", False)


def test_bad_real_parameters_are_refused():
    lab = get_lab("pd-split")
    with pytest.raises(ConfigError, match="real_max_tokens=0"):
        lab.run(lab.params(real_max_tokens=0), "host")
    with pytest.raises(ConfigError, match=r"real_prompt_lens=\(\): not a list"):
        lab.run(lab.params(real_prompt_lens=()), "host")


@pytest.mark.skipif(probe("gpu")[0], reason="this host has a GPU: nothing to refuse")
def test_gpu_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        run_lab("pd-split", None, "gpu")


def test_figure_stacks_pd_phases_beside_colocated(host):
    pytest.importorskip("plotly")
    fig = host.figures["ttft_split"]
    names = [t.name for t in fig.data]
    assert names == ["colocated TTFT", "PD prefill", "PD decode wait", "PD transfer"]
    rows = host.tables["handover"]
    top = [b + y for b, y in zip(fig.data[3].base, fig.data[3].y, strict=True)]
    assert top == pytest.approx([r["pd_ms"]["prefill"] + r["pd_ms"]["decode_wait"]
                                 + r["pd_ms"]["transfer"] for r in rows])
