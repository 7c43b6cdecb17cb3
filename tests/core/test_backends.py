"""The one device chooser: names, lazy factories, one-line refusals, the notebook error display."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from workbench import backends
from workbench.backends import Backend, BackendUnavailable, make_device, probe
from workbench.errors import ConfigError, DeviceError, WorkbenchError
from workbench.units import MiB

NO_GPU = "backend 'gpu': no CUDA GPU is visible here. Fix: use backend=\"sim\""


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend the driver shows ``n`` GPUs and cuda-python/torch are (not) installed."""

    def set_(n: int, modules: bool = True) -> None:
        monkeypatch.setattr(backends, "cuda_device_count", lambda: n)
        monkeypatch.setattr(backends, "_has_module", lambda name: modules)

    return set_


def test_sim_and_host_are_built_and_sim_knobs_are_dropped_for_host():
    assert make_device("sim", preset="a100").name == "sim-a100"
    host = make_device("host", preset="h200", env=None, capacity=64 * MiB)
    assert host.name == "host" and host.capacity == 64 * MiB
    assert probe("sim") == (True, "") and probe("host") == (True, "")
    assert make_device("host", zero_page=False, zero_writable=True).name == "host"  # CUDA-only


def test_an_engines_torch_device_maps_to_one_shared_device_per_process():
    from workbench.backends import shared_device

    dev = shared_device("cpu")
    assert shared_device("cpu") is dev and dev.name == "host"
    assert make_device("host") is not dev  # make_device always builds a new one
    with pytest.raises(BackendUnavailable, match="the host \\(cpu\\) and CUDA GPUs"):
        shared_device("xpu:0")


@pytest.mark.parametrize("name, message", [
    ("banana", "backend 'banana': unknown device name. Fix: use one of sim, host, gpu or cuda:N"),
    ("cuda:x", "backend 'cuda:x': the GPU index must be a whole number (cuda:0, cuda:1, ...). "
               'Fix: write cuda:N with N >= 0, or use backend="sim"'),
    ("cuda:-1", "backend 'cuda:-1': the GPU index must be a whole number (cuda:0, cuda:1, ...). "
                'Fix: write cuda:N with N >= 0, or use backend="sim"'),
])
def test_unknown_names_are_one_typed_line(name, message):
    with pytest.raises(BackendUnavailable) as err:
        make_device(name)
    assert str(err.value) == message and "\n" not in message
    assert isinstance(err.value, ConfigError) and isinstance(err.value, WorkbenchError)
    assert probe(name) == (False, message)


def test_gpu_on_a_machine_without_one(fake_gpus):
    fake_gpus(0)
    with pytest.raises(BackendUnavailable) as err:
        make_device("gpu")
    assert str(err.value) == NO_GPU
    assert probe("gpu") == (False, NO_GPU)
    assert probe("cuda:0") == (False, NO_GPU.replace("'gpu'", "'cuda:0'"))


def test_gpu_index_and_missing_libraries(fake_gpus):
    fake_gpus(2)
    assert probe("cuda:2") == (False, "backend 'cuda:2': this host shows 2 CUDA GPU(s), cuda:0 "
                                      'to cuda:1. Fix: pick one of those, or use backend="sim"')
    fake_gpus(2, modules=False)
    assert probe("cuda:1") == (False, "backend 'cuda:1': cuda-python is not installed. Fix: pip "
                                      "install 'kv-cache-workbench[gpu]' (and a CUDA build of "
                                      'torch), or use backend="sim"')


def test_cuda_n_passes_its_index_and_drops_sim_knobs(fake_gpus, monkeypatch):
    fake_gpus(2)
    built: list[dict] = []
    monkeypatch.setitem(backends.REGISTRY, "gpu", Backend(
        "gpu", "stand-in", lambda **kw: built.append(kw) or "dev", ("preset", "env", "capacity")))
    assert make_device("cuda:1", preset="h200", capacity=1, zero_page=False) == "dev"
    assert make_device("gpu") == "dev"
    assert built == [{"device_index": 1, "zero_page": False}, {"device_index": 0}]
    with pytest.raises(ConfigError, match="already picks a GPU"):
        make_device("cuda:1", device_index=0)


def test_a_gpu_that_cannot_be_opened_is_one_line(fake_gpus, monkeypatch):
    fake_gpus(1)

    def broken(**kw):
        raise DeviceError("init", "device 0 does not support CUDA virtual memory management")

    monkeypatch.setitem(backends.REGISTRY, "gpu", Backend("gpu", "stand-in", broken))
    with pytest.raises(BackendUnavailable) as err:
        make_device("gpu")
    assert str(err.value) == (
        "backend 'gpu': the CUDA device cannot be opened (init failed: device 0 does not support "
        "CUDA virtual memory management). Fix: check the GPU with nvidia-smi, or use "
        'backend="sim"')


def test_real_probe_on_this_host_agrees_with_make_device():
    ok, why = probe("gpu")
    if ok:
        pytest.skip("a CUDA GPU is visible: tests/gpu covers it")
    with pytest.raises(BackendUnavailable) as err:
        make_device("gpu")
    assert str(err.value) == why


def test_gpu_package_imports_neither_sim_nor_cuda():
    code = ("import sys, workbench.backends, workbench.gpu, workbench.gpu.device, "
            "workbench.gpu.zeropage, workbench.gpu.driver\n"
            "print(sorted(m for m in sys.modules if m.startswith('workbench.sim') "
            "or m.split('.')[0] in ('torch', 'cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class _Shell:
    def __init__(self, custom=()):
        self.custom_exceptions = custom
        self.handler = None
        self.shown: list = []

    def set_custom_exc(self, exc_tuple, handler):
        self.custom_exceptions, self.handler = exc_tuple, handler

    def _showtraceback(self, etype, value, stb):
        self.shown.append((etype, stb))


def test_notebook_handler_shows_one_line(monkeypatch):
    shell = _Shell()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.setattr(sys, "last_value", None, raising=False)
    assert backends.install_notebook_errors()
    assert shell.custom_exceptions == (WorkbenchError,)
    err = BackendUnavailable("backend 'gpu'", "no CUDA GPU is visible here", 'use backend="sim"')
    shell.handler(shell, type(err), err, None)
    assert shell.shown == [(BackendUnavailable, ["error: " + NO_GPU])]
    assert sys.last_value is err
    mine = _Shell(custom=(KeyError,))  # a user's own handler is left alone
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: mine))
    assert not backends.install_notebook_errors() and mine.custom_exceptions == (KeyError,)


def test_each_backend_says_what_it_can_do(fake_gpus):
    from workbench.backends import capabilities

    sim, host, gpu, cuda1 = (capabilities(n) for n in ("sim", "host", "gpu", "cuda:1"))
    assert (sim.simulated, sim.capacity_settable, sim.real_processes, sim.cuda,
            sim.torch_device) == (True, True, False, False, None)
    assert (host.simulated, host.capacity_settable, host.real_processes, host.cuda,
            host.torch_device) == (False, True, True, False, "cpu")
    assert (gpu.simulated, gpu.capacity_settable, gpu.real_processes, gpu.cuda,
            gpu.torch_device) == (False, False, True, True, "cuda")
    assert (cuda1.kind, cuda1.torch_device) == ("gpu", "cuda:1")
    fake_gpus(3)
    assert gpu.gpus() == 3 and sim.gpus() == 0 and host.gpus() == 0
    with pytest.raises(BackendUnavailable, match="unknown device name"):
        capabilities("tpu")


def test_devices_say_where_their_memory_is_and_wrappers_pass_it_on():
    from workbench.core.budget_device import BudgetDevice
    from workbench.core.device import FaultyDevice

    sim, host = make_device("sim"), make_device("host", capacity=64 * MiB)
    assert (sim.torch_device, sim.queued_work) == (None, False)
    assert (host.torch_device, host.queued_work) == ("cpu", False)
    for wrapped in (FaultyDevice(host), BudgetDevice(host, 8 * MiB)):
        assert (wrapped.torch_device, wrapped.queued_work) == ("cpu", False)


def test_the_fence_follows_the_device_not_its_name():
    from workbench.adapters.vllm.fences import fence_factory

    host = make_device("host", capacity=64 * MiB)
    assert fence_factory(host) is None
    named_like_cuda = types.SimpleNamespace(name="cuda:0", index=0, tensor=lambda *a: None,
                                            queued_work=False, torch_device="cpu")
    assert fence_factory(named_like_cuda) is None  # a name or attributes decide nothing
