"""``workbench doctor``: the manifest has every section of seed 000 §2 and valid JSON."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from workbench.cli import app


def test_doctor_json_manifest(monkeypatch):
    monkeypatch.setenv("WORKBENCH_KV_MAX_CACHED_TOKENS", "128")
    res = CliRunner().invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)
    assert {"hardware", "os", "python", "torch", "workbench", "config", "engines"} <= set(m)
    assert m["hardware"]["cores"] >= 1
    assert m["config"]["pool_config"]["max_cached_tokens"] == 128
    assert m["config"]["env"]["WORKBENCH_KV_MAX_CACHED_TOKENS"] == "128"
    assert set(m["engines"]) == {"sglang", "vllm"}
    for e in m["engines"].values():
        assert "installed" in e


def test_doctor_text_and_bad_config(monkeypatch):
    monkeypatch.setenv("WORKBENCH_KV_PAGE_SIZE", "3KiB")
    res = CliRunner().invoke(app, ["doctor"])
    assert res.exit_code == 0, res.output
    assert "python" in res.output and "BAD CONFIG" in res.output
    assert "WORKBENCH_KV_PAGE_SIZE=3KiB" in res.output


def test_doctor_warns_when_switch_is_on_but_pth_is_missing(monkeypatch):
    from workbench.adapters import pth

    monkeypatch.setenv("WORKBENCH_KV_AUTOPATCH", "1")
    monkeypatch.setattr(pth, "installed", lambda: False)
    res = CliRunner().invoke(app, ["doctor"])
    assert res.exit_code == 0, res.output
    assert "autopatch=on" in res.output and "UNPATCHED" in res.output
