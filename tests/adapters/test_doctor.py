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


def test_doctor_reports_backends_and_what_the_engines_accept(monkeypatch):
    from workbench import backends

    monkeypatch.setattr(backends, "cuda_device_count", lambda: 0)
    res = CliRunner().invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)
    rows = {b["backend"]: b for b in m["backends"]}
    assert set(rows) == {"sim", "host", "gpu"}
    assert rows["sim"]["usable"] and rows["host"]["usable"]
    assert rows["gpu"]["usable"] is False and "no CUDA GPU is visible" in rows["gpu"]["why"]
    assert "driver" in rows["gpu"] and "cuda_python" in rows["gpu"]
    assert m["accepts"]["sglang"]["tensor_parallel"] == "1"
    assert m["accepts"]["vllm"]["executors"]
    text = CliRunner().invoke(app, ["doctor"]).output
    assert "backend    gpu      NOT usable: backend 'gpu': no CUDA GPU is visible" in text
    assert "accepts    sglang   executors=scheduler tp=1" in text


def test_doctor_check_exits_non_zero_on_bad_configuration(monkeypatch):
    monkeypatch.setenv("WORKBENCH_KV_MIN_RESERVED_PAGES", "9")
    monkeypatch.setenv("WORKBENCH_KV_MAX_RESERVED_PAGES", "2")
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 0  # reported, not fatal
    res = CliRunner().invoke(app, ["doctor", "--check"])
    assert res.exit_code == 1 and "BAD CONFIG" in res.output
    monkeypatch.delenv("WORKBENCH_KV_MIN_RESERVED_PAGES")
    monkeypatch.delenv("WORKBENCH_KV_MAX_RESERVED_PAGES")
    assert CliRunner().invoke(app, ["doctor", "--check"]).exit_code == 0
