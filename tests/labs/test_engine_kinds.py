"""Engine kinds as things: one registry (workbench.engines.kinds) with names that mean the same on
every backend, the old spellings mapped in one table, one resolved run handed to each lab, the
labs' engine choices shown alike everywhere -- and a new real engine kind, registered here in
the tests alone, runs a real-engine lab with no lab file touched."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.backends import capabilities
from workbench.cli import app
from workbench.engines import kinds
from workbench.engines.kinds import EngineKind
from workbench.engines.real.server import ServerEngine, block_bytes
from workbench.engines.real.vllm import VllmSpec
from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab, run_lab
from workbench.labs.kit.resolve import LabRun

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).parents[1] / "engines" / "real" / "fake_server.py"


def test_every_kind_says_what_it_is_and_where_it_runs():
    assert list(kinds.REGISTRY) == ["sim-vllm", "sim-sglang", "mini", "vllm", "sglang"]
    sim, host, gpu = (capabilities(b) for b in ("sim", "host", "gpu"))
    where = {n: [b for b, c in (("sim", sim), ("host", host), ("gpu", gpu))
                 if k.refusal(c) is None] for n, k in kinds.REGISTRY.items()}
    assert where == {"sim-vllm": ["sim"], "sim-sglang": ["sim"], "mini": ["host", "gpu"],
                     "vllm": ["host", "gpu"], "sglang": ["gpu"]}
    for k in kinds.REGISTRY.values():
        assert k.family in kinds.FAMILIES and k.title and k.scheduler in ("vllm", "sglang")
        assert bool(k.engine) == (k.family == "server")
    assert kinds.get("vllm").server().kind == "vllm"
    assert kinds.get("sglang").server().kind == "sglang"
    with pytest.raises(ConfigError, match="is not a server kind"):
        kinds.get("mini").server()
    with pytest.raises(ConfigError, match="is not an engine kind"):
        kinds.get("vLLM")


@pytest.mark.parametrize("text, simulated, names", [
    ("vllm", True, "sim-vllm"), ("vllm", False, "vllm"), ("sglang", True, "sim-sglang"),
    ("sglang", False, "sglang"), ("mini", False, "mini"), ("sim", True, "sim-vllm+sim-sglang"),
    ("sim", False, "sim-vllm+sim-sglang"), ("real", False, "vllm+sglang"),
    ("sim-vllm", False, "sim-vllm"), ("vllm+sglang", True, "vllm+sglang")])
def test_the_old_spellings_mean_one_thing_on_each_backend(text, simulated, names):
    assert "+".join(k.name for k in kinds.parse(text, simulated)) == names


def test_the_old_spellings_are_one_table_of_registered_kinds():
    for (old, simulated), new in kinds.OLD_SPELLINGS.items():
        assert all(n in kinds.REGISTRY for n in new.split("+"))
        assert kinds.spelled(old, simulated) == new
        back = kinds.old_spelling(new, simulated)
        assert kinds.OLD_SPELLINGS[(back, simulated)] == new


# the backends each lab ran on before the registry (in the backend registry's order)
BACKENDS = {
    "colocation": ("sim", "host", "gpu"), "idle-footprint": ("sim", "host", "gpu"),
    "grow-reclaim": ("sim", "host", "gpu"), "same-engine-pair": ("sim", "host", "gpu"),
    "cross-engine": ("sim", "gpu"), "prefix-bound": ("sim",), "kv-capacity": ("sim", "host", "gpu"),
    "baseline": ("sim",), "chunked-prefill": ("sim",), "control-groups": ("sim",),
    "no-fake-enable": ("sim", "host", "gpu"), "dynamic-limit": ("sim", "host", "gpu"),
    "tp-pp": ("sim", "host", "gpu"), "faults": ("sim", "host", "gpu"),
    "output-equality": ("host", "gpu"), "tiered-retrieval": ("sim", "host", "gpu"),
    "store-routes": ("sim",), "pd-split": ("sim", "host", "gpu"),
    "transfer-faults": ("sim",), "non-prefix-reuse": ("sim", "host")}


@pytest.mark.parametrize("name", list(LABS))
def test_each_lab_declares_its_runs_and_the_kit_does_the_rest(name):
    """Runners keyed by family, every declared engine served by one, no lab's own backend
    check, and the backends it lists following from that data as they were before."""
    lab = get_lab(name)
    assert set(lab.runners) <= set(kinds.FAMILIES) and all(map(callable, lab.runners.values()))
    for n in lab.engines:
        assert kinds.get(n.split("+")[0]).family in lab.runners
    assert "check_backend" not in vars(type(lab)) and "run" not in vars(type(lab))
    assert lab.backends == BACKENDS[name]


def test_the_resolved_run_names_its_kind_the_same_on_every_backend(monkeypatch):
    monkeypatch.setattr("workbench.backends.require", lambda backend: backend)
    lab = get_lab("kv-capacity")
    sim = lab.check_backend("sim", lab.params())
    assert isinstance(sim, LabRun) and (sim.family, sim.kind) == ("simulated", "sim-vllm")
    assert lab.check_backend("sim", lab.params(engine="sim-vllm")).kind == "sim-vllm"
    with pytest.raises(ConfigError, match="engine=sim-vllm on backend 'host'"):
        lab.check_backend("host", lab.params(engine="sim-vllm"))
    base = get_lab("baseline")
    assert base.check_backend("sim", base.params(engine="sglang")).kind == "sim-sglang"
    assert base.check_backend("sim", base.params(engine="sim-sglang")).engine.scheduler \
        == "sglang"
    colo = get_lab("colocation")
    assert colo.check_backend("sim", colo.params()).kind == "sim-vllm"
    assert colo.check_backend("host", colo.params()).kind == "mini"
    assert get_lab("tp-pp").check_backend("host").engines == ()


def test_the_new_names_and_the_old_give_the_same_record():
    old = run_lab("baseline", get_lab("baseline").params(engine="sglang", quick=True,
                                                         num_requests=30, repeats=1))
    new = run_lab("baseline", get_lab("baseline").params(engine="sim-sglang", quick=True,
                                                         num_requests=30, repeats=1))
    assert old.markdown == new.markdown and old.tables == new.tables


# -- a stand-in real engine kind, registered in this file alone ---------------------------------

class ToyEngine(ServerEngine):
    """A third server kind: the vLLM stand-in's server behind vLLM's flags."""

    kind = "toy"
    spec_type = VllmSpec
    label = "toy server"
    title = "toy server"
    server_text = "a toy server through its OpenAI-style API"
    server_short = "toy server"
    model_text = "a toy config.json"

    @classmethod
    def why_missing(cls) -> str | None:
        return None

    @classmethod
    def interpreter(cls, what: str) -> str:
        return sys.executable

    @classmethod
    def model_dir(cls, python: str, root: Path) -> str:
        (root / "toy").mkdir(exist_ok=True)
        (root / "toy" / "config.json").write_text(json.dumps(
            {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
             "head_dim": 64, "num_hidden_layers": 2}))
        return str(root / "toy")

    def server_command(self) -> list[str]:
        return [sys.executable, str(FAKE)]

    def _wait_healthy(self) -> None:
        """The stand-in answers /health before its core child publishes the pool's segment,
        which a real vLLM has done by then: wait for that too."""
        from workbench.core import control

        ServerEngine._wait_healthy(self)
        end = time.monotonic() + 60
        while self.ipc_name and control.read_segment(self.ipc_name) is None:
            assert time.monotonic() < end, "the stand-in's core never published its segment"
            time.sleep(0.05)

    def blocks_per_page(self, page_id_bytes: int) -> tuple[int, int]:
        return 16, page_id_bytes // block_bytes(self.spec.model, 16)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(kinds.REGISTRY, "toy", EngineKind(
        "toy", "server", "toy server", "vllm", "Toy", engine=f"{__name__}:ToyEngine"))
    monkeypatch.setenv("FAKE_TOKEN_S", "0.002")


def test_a_new_server_kind_runs_a_real_engine_lab_with_no_lab_file_touched(toy):
    lab = get_lab("grow-reclaim")
    assert "toy" in lab.engines and "toy" not in get_lab("kv-capacity").engines
    res = run_lab("grow-reclaim", lab.params(engine="toy", quick=True), "host")
    assert res.record.environment["engine"] == "toy"
    assert res.markdown.startswith("# Grow and reclaim (toy server)")
    phases = res.record.raw_data["run"]["phases"]
    assert [p["phase"] for p in phases][:3] == ["idle-0", "short", "long"]
    assert all(p["finished"] == p["requests"] for p in phases), [p["lost"] for p in phases]
    with pytest.raises(ConfigError, match="not an engine this lab runs"):
        get_lab("kv-capacity").params(engine="toy")


def test_the_engine_choices_read_alike_in_help_and_in_each_labs_parameters(toy):
    runner = CliRunner()
    help_text = " ".join(runner.invoke(app, ["labs", "run", "--help"],
                                       terminal_width=200).output.split())
    assert all(name in help_text for name in kinds.REGISTRY)
    for name in LABS:
        out = runner.invoke(app, ["labs", "params", name, "--json"])
        assert out.exit_code == 0, out.output
        rows = {r["name"]: r for r in json.loads(out.output)}
        lab = get_lab(name)
        assert set(rows) == {f.name for f in dataclasses.fields(lab.params_type)}
        assert all(r["range"] != "(undeclared)" for r in rows.values())
        if lab.engines:
            assert "one of " + ", ".join(lab.engines) in rows["engine"]["range"]


def test_colocation_options_are_colocations_alone():
    runner = CliRunner()
    options = runner.invoke(app, ["labs", "run", "--help"]).output.partition("Options:")[2]
    offered = re.findall(r"^\s+(--[\w-]+)", options, re.M)
    assert "--backend" in offered and not {"--peaks", "--steptime"} & set(offered)
    bad = runner.invoke(app, ["labs", "run", "baseline", "--peaks", "12"])
    assert bad.exit_code != 0 and "--peaks" in bad.output and "labs params baseline" in \
        bad.output
    peaks = get_lab("colocation").parse_params({"peaks": "12,14"}).peaks
    assert peaks == (12, 14)


def test_no_code_outside_the_tables_decides_by_an_engine_name():
    """``engine == "vllm"`` and friends: only tables and messages may name a kind."""
    out = subprocess.run(["git", "grep", "-nE", r'(==|!=|in) *\(?"(vllm|sglang|mini|real)"',
                          "workbench"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    assert out.stdout == ""
