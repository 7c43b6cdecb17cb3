"""``pip install kv-cache-workbench`` with no extras, in a clean venv (no system site-packages),
then the commands a newcomer types first, each in a real subprocess: ``labs list``, one ``sim``
lab of each family and ``--html``. Only the core dependencies come from the package index."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# One sim lab per family: serving (colocation), phased pools (grow-reclaim), the protocol walk
# (tp-pp), faults, a modelled tier (tiered-retrieval), and two engine kinds (cross-engine).
FAMILY_LABS = ("00", "02", "04", "12", "13", "15")
pytestmark = pytest.mark.slow


def _source(tmp: Path) -> Path:
    """The package's files as git sees them (no built .so, no caches), so the build never
    writes into the checkout."""
    src = tmp / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                            "pyproject.toml", "README.md", "workbench"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    return src


@pytest.fixture(scope="module")
def core_bin(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("core")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", str(_source(tmp))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return env_dir / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(bin_dir / "workbench"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(900)
def test_core_install_has_no_extras(core_bin, tmp_path):
    probe = ("import importlib.util as u; print([m for m in ('torch', 'ipywidgets', "
             "'jupyterlab', 'IPython') if u.find_spec(m)])")
    found = subprocess.run([str(core_bin / "python"), "-c", probe], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == "[]", found


@pytest.mark.timeout(900)
def test_labs_list_and_a_sim_lab_of_each_family(core_bin, tmp_path):
    listed = _run(core_bin, "labs", "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    labs = json.loads(listed.stdout)
    assert [r["number"] for r in labs] == [f"{i:02d}" for i in range(len(labs))]
    for number in FAMILY_LABS:
        done = _run(core_bin, "labs", "run", number, "--quick", "--json", cwd=tmp_path)
        assert done.returncode == 0, (number, done.stderr[-3000:])
        assert json.loads(done.stdout)["verdict"], number


@pytest.mark.timeout(900)
def test_html_in_the_core_install(core_bin, tmp_path):
    out = tmp_path / "page"
    done = _run(core_bin, "labs", "run", "02", "--quick", "--html", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "index.html").read_text()
    assert "Plotly" in page and "<table>" in page
    assert not re.search(r"<script[^>]*\bsrc=", page)  # plotly.js inline, nothing fetched
