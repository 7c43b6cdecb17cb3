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
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    facts = VllmEngine.build_facts("cuda")
    assert facts["vllm_build"] == "compiled ops" and facts["model_runner"] == "V1"
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")  # vLLM decides (0.26: V2 for dense models)
    assert VllmEngine.build_facts("cuda")["model_runner"] == "vLLM's default (not recorded)"
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


def test_the_record_names_the_runner_the_run_asked_for(monkeypatch):
    monkeypatch.setattr("workbench.engines.real.vllm_build.build", lambda: "compiled ops")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert VllmEngine.build_facts("cuda", "v2")["model_runner"] == "V2"
    out = {"engine": "vllm", "device": "cuda", "backend": "gpu", "runner": "v2"}
    assert server_report.build_facts(out)["model_runner"] == "V2"


def test_a_labs_runner_becomes_vllms_env_and_sglang_refuses_one(tmp_path):
    import pytest

    from workbench.errors import ConfigError

    eng = VllmEngine.for_lab("t", "cuda", "m", "py", tmp_path, elastic=False, runner="v2",
                             env={"VLLM_BATCH_INVARIANT": "1"})
    assert eng.spec.env == {"VLLM_BATCH_INVARIANT": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert VllmEngine.runner_env("v1") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    with pytest.raises(ConfigError) as err:
        SglangEngine.runner_env("v2")
    assert "one model runner" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="use runner=v1 or v2"):
        VllmEngine.runner_env("v3")


def test_a_server_that_ran_another_runner_than_asked_is_refused(tmp_path):
    import pytest

    from workbench.errors import ConfigError

    eng = VllmEngine.for_lab("t", "cuda", "m", "py", tmp_path, elastic=False, runner="v2")
    eng.log.write_text("INFO ... Using V1 engine\n")
    assert eng.runner_ran() == "v1"
    with pytest.raises(ConfigError, match="its vLLM ran model runner V1"):
        eng.check_runner()
    eng = VllmEngine.for_lab("u", "cuda", "m", "py", tmp_path, elastic=False, runner="v2")
    eng.log.write_text("INFO [gpu_worker.py:378] Using V2 Model Runner\n")
    eng.check_runner()  # what it asked for
    assert eng.runner == "v2"
    eng.close()


def test_the_runner_an_engine_ran_is_read_also_when_none_was_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    eng = VllmEngine.for_lab("w", "cuda", "m", "py", tmp_path, elastic=False)
    eng.log.write_text("INFO Using V2 Model Runner\n")  # vLLM 0.26's own pick for a dense model
    eng.check_runner()
    assert eng.runner == "v2"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # inherited, as make gpu-labs sets it
    eng.log.write_text("INFO ...\n")
    import pytest

    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="runner=v2"):
        eng.check_runner()


def test_the_three_labs_take_the_runner_as_a_checked_parameter():
    import pytest

    from workbench.errors import ConfigError
    from workbench.labs.kit import params

    for lab in ("output-equality", "dynamic-limit", "grow-reclaim"):
        from workbench.labs import get_lab

        t = get_lab(lab).params_type
        assert params.check_value(lab, t, "runner", "v2") == "v2"
        assert params.check_value(lab, t, "runner", "none") is None
        with pytest.raises(ConfigError):
            params.check_value(lab, t, "runner", "v3")


def test_a_runner_on_a_run_without_a_real_vllm_is_refused_before_it_starts(monkeypatch):
    import pytest

    from workbench.errors import ConfigError
    from workbench.labs import get_lab

    lab = get_lab("dynamic-limit")
    with pytest.raises(ConfigError) as err:  # the simulated engine has no model runner
        lab.run(lab.params(runner="v2", quick=True), backend="sim")
    assert "picks a real vLLM's model runner" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setattr(SglangEngine, "interpreter", classmethod(lambda cls, what: "python"))
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    with pytest.raises(ConfigError, match="one model runner"):
        lab.run(lab.params(runner="v1", engine="sglang", quick=True), backend="gpu")
