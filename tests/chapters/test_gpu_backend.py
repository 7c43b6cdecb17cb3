"""The chapters' runs with ``backend="gpu"``: the same scenarios on real CUDA virtual memory, or,
where no GPU is visible, one line that says so.

What a chapter's one-word switch promises: every scenario the chapters run works on the GPU
backend, the event trace still equals the pools' own state, and the ledger's invariants hold
(``make test-gpu`` runs those). On a machine without a GPU each chapter stops at its first device
cell with the one-line refusal, not a traceback (that runs in ``make test``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# as in nbrun.py, without importing the notebook stack (a bare GPU box may lack it)
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "chapters").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def gpu():
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    from workbench.backends import make_device
    from workbench.errors import ConfigError, DeviceError

    try:
        make_device("gpu").close()
    except (ConfigError, DeviceError) as err:
        pytest.skip(f"no usable CUDA device: {err}")
    return "gpu"


def _run_with_backend(path, backend: str):
    """Execute ``path`` with its parameters cell set to ``backend``, as "run all" would: stop at
    the first failing cell. Returns the notebook with its outputs."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert 'backend = "sim"' in params.source
    params.source = params.source.replace('backend = "sim"', f"backend = {backend!r}")
    kernel = "workbench" if "workbench" in KernelSpecManager().find_kernel_specs() else "python3"
    client = NotebookClient(nb, timeout=120, kernel_name=kernel, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError:
        pass
    return nb


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_chapter_without_a_gpu_stops_at_its_first_device_cell_with_one_line(path, monkeypatch):
    pytest.importorskip("nbclient", reason="no notebook stack here (make setup)")
    pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")
    from workbench.backends import probe

    ok, why = probe("gpu")
    if ok:
        pytest.skip("a CUDA GPU is visible here: the chapters run on it (tests above)")
    monkeypatch.setenv("WORKBENCH_SCORES", "")
    nb = _run_with_backend(path, "gpu")
    code = [c for c in nb.cells if c.cell_type == "code"]
    start = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    first = next(i for i, c in enumerate(code) if i > start and "backend" in c.source)
    for c in code[:first]:  # everything before it ran cleanly
        assert c.execution_count is not None
        assert all(o.output_type != "error" for o in c.outputs)
    out = code[first].outputs
    assert [o.output_type for o in out] == ["error"]
    assert out[0].traceback == [f"error: {why}"]  # one line, nothing else
    assert out[0].ename == "BackendUnavailable" and "no CUDA GPU is visible here" in why
    for c in code[first + 1:]:  # the run stopped there
        assert c.execution_count is None and not c.outputs
    text = "".join(str(o) for o in out)  # earlier cells' tables may hold "---"; they had no error
    assert "Traceback" not in text and "File " not in text and "---" not in text


def _same_as_pools(rec) -> None:
    states = rec.states_at(None)
    for name, kv in rec.managers.items():
        assert states[name] == [s.value for s in kv.pages.state]
        assert rec.series()[name]["mapped"][-1] == kv.mapped_bytes
        kv.check_invariants()


def _close(rec) -> None:
    for kv in rec.managers.values():
        kv.close()


@pytest.mark.gpu
def test_churn_with_limit_on_gpu(gpu):
    from workbench.viz.scenarios import churn

    res = churn(steps=30, load=6, limit_pages=10, limit_at=15, backend=gpu)
    _same_as_pools(res.rec)
    assert res.finished["pool"] > 0 and res.limit_results
    _close(res.rec)


@pytest.mark.gpu
def test_churn_matches_sim_event_for_event(gpu):
    """Same seeded run on both backends: the same page transitions (timings aside)."""
    from workbench.viz.scenarios import churn

    sim = churn(steps=25, load=6, limit_pages=8, limit_at=12, backend="sim")
    real = churn(steps=25, load=6, limit_pages=8, limit_at=12, backend=gpu)
    assert [e.key() for e in real.rec.events] == [e.key() for e in sim.rec.events]
    _close(real.rec)


@pytest.mark.gpu
def test_one_request_colocation_prefix_on_gpu(gpu):
    from workbench.viz.scenarios import colocation, one_request, prefix_sharing

    kv, ids, rec = one_request(300, backend=gpu)
    assert len(ids) == 19
    _same_as_pools(rec)
    _close(rec)
    co = colocation(steps=24, limit_pool="a", limit_gib=0.25, limit_at=4, backend=gpu)
    _same_as_pools(co.rec)
    _close(co.rec)
    pre = prefix_sharing(steps=12, max_cached_tokens=1024, backend=gpu)
    _same_as_pools(pre.rec)
    assert pre.hits > 0
    _close(pre.rec)


@pytest.mark.gpu
def test_driver_layer_chapter_runs_on_the_real_driver(gpu):
    """Chapter 11 with backend="gpu": the eight VMM calls on cuda.bindings.driver, a torch view
    over the raw pointer, a CUDA graph replayed over remapped memory, no error anywhere."""
    pytest.importorskip("nbclient", reason="no notebook stack here (make setup)")
    nb = _run_with_backend(NOTEBOOKS[0].parent / "11_driver_layer.ipynb", gpu)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors[0].get("traceback")
    out = "".join(o.get("text", "") for c in code for o in c.outputs)
    print(out)
    assert "driver: the CUDA driver on" in out and "1. granularity  2 MiB" in out
    assert "6. tensor view  1,048,576 fp16" in out and "sum 1,048,576" in out
    assert "same tensor, same pointer: True" in out and "zero page mapped read-write" in out
    assert "same graph replayed: sum 2,097,152 (the new memory)" in out
