"""A real-engine lab's record and report name the build the engine ran (vLLM: compiled ops or
the stand-in, the model runner, the attention), so no GPU figure hides which vLLM made it."""

from __future__ import annotations

from workbench.engines.real.sglang import SglangEngine
from workbench.engines.real.vllm import VllmEngine
from workbench.labs.kit import server_report


def test_vllm_names_its_build_runner_and_attention(monkeypatch):
    monkeypatch.setattr("workbench.engines.real.vllm_build.build", lambda: "stand-in (x)")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    facts = VllmEngine.build_facts("cuda")
    assert facts == {"vllm_build": "stand-in (x)", "model_runner": "V2",
                     "attention": "TRITON_ATTN (the stand-in has no attention kernels)"}
    monkeypatch.setattr("workbench.engines.real.vllm_build.build", lambda: "compiled ops")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    facts = VllmEngine.build_facts("cuda")
    assert facts["vllm_build"] == "compiled ops" and facts["model_runner"] == "V1"
    assert facts["attention"].startswith("vLLM's default")
    assert SglangEngine.build_facts("cuda") == {}


def test_the_report_and_record_carry_the_build(monkeypatch):
    monkeypatch.setattr("workbench.engines.real.vllm_build.build", lambda: "compiled ops")
    out = {"engine": "vllm", "device": "cuda", "backend": "gpu"}

    def report(out):
        rec = server_report.real_record("output-equality", out, "h", "supported", "h", "m",
                                        {}, {})
        return rec, server_report.real_markdown("Output equality", [("a", "b")], [],
                                                "supported")

    result = server_report.real_result(report, lambda: out)
    assert result.record.manifest.engine_config["build"]["vllm_build"] == "compiled ops"
    lines = result.markdown.splitlines()
    assert lines[0].startswith("# Output equality") and lines[2].startswith("**Build:** ")
    assert "vllm_build compiled ops" in lines[2] and "**Verdict:** supported" in lines[4]
