"""The autopatch framework on a small fake engine package written to a temp dir.

The framework is engine-agnostic; the real-engine plans are tested in tests/engines_real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from workbench.adapters import boot, hook, pth
from workbench.adapters.patching import replace_class, wrap_method
from workbench.adapters.registry import AutopatchError, EnginePlan, Patch
from workbench.adapters.versions import VersionRange, release

FAKE = {
    "fakeeng/__init__.py": "__version__ = '{version}'\n",
    "fakeeng/pool.py": textwrap.dedent("""
        class Pool:
            def alloc(self, n):
                return list(range(n))
    """),
    # imports the pool at import time: a stale reference the patch must rebind
    "fakeeng/sched.py": textwrap.dedent("""
        from fakeeng.pool import Pool
        from fakeeng import alloc

        def make():
            return Pool()
    """),
    "fakeeng/alloc.py": textwrap.dedent("""
        class Alloc:
            def size(self):
                return 10
    """),
}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    def write(version="1.2.3"):
        for rel, text in FAKE.items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text.format(version=version) if "{version}" in text else text)
        return tmp_path

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    boot.reset()
    for name in [m for m in sys.modules if m == "fakeeng" or m.startswith("fakeeng.")]:
        del sys.modules[name]


class ElasticPool:
    def alloc(self, n):
        return None if n > 4 else list(range(100, 100 + n))


def _pool_patch(versions=">=1.2,<1.3", **kw):
    return Patch("elastic-pool", "fakeeng.pool", versions,
                 apply=lambda m: replace_class(m, "Pool", ElasticPool, "fakeeng"), **kw)


def _size_patch(versions=">=1.2,<1.3", value=42, **kw):
    return Patch("alloc-size", "fakeeng.alloc", versions,
                 apply=lambda m: wrap_method(m.Alloc, "size", lambda orig: lambda self: value),
                 **kw)


def _plan(*patches):
    return boot.register(EnginePlan("fakeeng", "fakeeng", ("fakeeng",), list(patches)))


def test_versions():
    assert release("0.32.0+cpu") == (0, 32) and release("0.5.23.post1") == (0, 5, 23)
    r = VersionRange(">=0.5.23,<0.5.24")
    assert "0.5.23" in r and "0.5.23.post2" in r and "0.5.24" not in r and "0.5.22" not in r
    assert "0.33.0" in VersionRange(">=0.32,<0.34") and "0.34.0rc1" not in VersionRange("<0.34")
    with pytest.raises(ValueError):
        VersionRange("~=1.0")


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(boot.ENV, raising=False)
    assert boot.install() == {}
    assert not any(isinstance(f, hook.PatchFinder) for f in sys.meta_path)


def test_applies_after_import_and_rebinds_stale_refs(fake):
    fake()
    plan = _plan(_pool_patch(), _size_patch())
    import fakeeng.sched as sched  # imports pool (trigger) and alloc; sched holds Pool

    assert plan.state == "applied"
    assert sched.make().alloc(8) is None  # the miss path of the elastic pool
    import fakeeng.alloc

    assert fakeeng.alloc.Alloc().size() == 42
    assert [r.status for r in plan.records] == ["applied", "applied"]
    assert {r["patch"] for r in boot.status()} == {"elastic-pool", "alloc-size"}
    plan.revert()
    import fakeeng.pool

    assert fakeeng.pool.Pool().alloc(2) == [0, 1] and fakeeng.alloc.Alloc().size() == 10


def test_wrong_version_fails_loudly_and_patches_nothing(fake):
    fake(version="2.0.0")
    plan = _plan(_pool_patch(fix="pin fakeeng==1.2.*"), _size_patch())
    with pytest.raises(AutopatchError) as err:
        import fakeeng.pool  # noqa: F401
    msg = str(err.value)
    assert "elastic-pool" in msg and "2.0.0" in msg and "pin fakeeng==1.2.*" in msg
    assert "alloc-size" in msg and "nothing was patched" in msg
    assert plan.state == "failed"
    with pytest.raises(AutopatchError):  # later imports keep failing: no half-patched start
        import fakeeng.sched  # noqa: F401
    assert sys.modules["fakeeng.alloc"].Alloc().size() == 10  # imported by the check, unpatched


def _counting(patch, applied):
    def apply(module):
        applied.append(patch.name)
        return patch.apply(module)

    return Patch(patch.name, patch.module, patch.versions, apply, patch.check, patch.required)


def test_check_failure_blocks_every_patch(fake):
    fake()
    applied = []
    plan = _plan(_counting(_pool_patch(), applied),
                 _size_patch(check=lambda m: "Alloc.size changed signature"))
    with pytest.raises(AutopatchError, match="alloc-size.*changed signature"):
        import fakeeng.sched  # noqa: F401
    assert applied == [] and plan.state == "failed"
    with pytest.raises(AutopatchError):  # every later import in the package fails the same way
        import fakeeng.sched  # noqa: F401,F811


def test_apply_failure_rolls_back_earlier_patches(fake):
    fake()

    def boom(module):
        raise KeyError("Alloc.size")

    seen = []

    def pool_apply(module):
        seen.append(module)
        return replace_class(module, "Pool", ElasticPool, "fakeeng")

    plan = _plan(Patch("elastic-pool", "fakeeng.pool", ">=1", pool_apply),
                 Patch("breaks", "fakeeng.alloc", ">=1", apply=boom))
    with pytest.raises(AutopatchError, match="apply failed.*were undone"):
        import fakeeng.sched  # noqa: F401
    assert plan.state == "failed"
    assert seen and seen[0].Pool is not ElasticPool  # the first patch was undone


def test_variant_by_version_and_optional_patches(fake):
    fake(version="1.4.0")
    plan = _plan(_size_patch(">=1.2,<1.3", value=1), _size_patch(">=1.3,<1.5", value=2),
                 _pool_patch(">=1.2,<1.3", required=False))
    import fakeeng.alloc
    import fakeeng.pool

    assert plan.state == "applied" and fakeeng.alloc.Alloc().size() == 2
    assert fakeeng.pool.Pool is not ElasticPool
    st = {r.patch: r.status for r in plan.records}
    assert st == {"alloc-size": "applied", "elastic-pool": "not-applicable"}


def test_already_imported_module_is_patched_at_register(fake):
    fake()
    import fakeeng.alloc
    import fakeeng.pool  # noqa: F401

    plan = _plan(_pool_patch(), _size_patch())
    assert plan.state == "applied" and fakeeng.alloc.Alloc().size() == 42


def test_loader_passthrough(fake):
    fake()
    _plan(_pool_patch())
    import fakeeng.pool

    assert fakeeng.pool.__spec__.loader.is_package("fakeeng.pool") is False
    assert fakeeng.pool.__file__.endswith("pool.py")


@pytest.mark.parametrize("on", [True, False])
def test_pth_line_boots_only_when_enabled(tmp_path, on):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / pth.NAME).write_text(pth.LINE)
    env = {k: v for k, v in os.environ.items() if k != boot.ENV}
    if on:
        env[boot.ENV] = "1"
    code = ("import site, sys; site.addsitedir(sys.argv[1]); "
            "print('workbench.adapters.boot' in sys.modules, "
            "any(type(f).__name__ == 'PatchFinder' for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code, str(site_dir)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ([str(on)] * 2)


def test_the_patch_log_reaches_stderr_of_a_process_booted_by_the_pth(tmp_path, fake):
    """An engine process configures only its own loggers: the "applied" line must still reach
    its stderr (the server's log), and once, also after root logging is configured later."""
    root = fake()
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / pth.NAME).write_text(pth.LINE)
    code = textwrap.dedent("""
        import logging, site, sys
        site.addsitedir(sys.argv[1])
        from workbench.adapters import boot
        from workbench.adapters.patching import replace_class
        from workbench.adapters.registry import EnginePlan, Patch
        class P:
            pass
        boot.install()
        boot.register(EnginePlan("fakeeng", "fakeeng", ("fakeeng",), [Patch(
            "elastic-pool", "fakeeng.pool", ">=1.2,<1.3",
            apply=lambda m: replace_class(m, "Pool", P, "fakeeng"))]))
        logging.basicConfig(level=logging.INFO)  # the engine configures logging afterwards
        boot.install()  # a second boot adds no second handler
        import fakeeng.pool
    """)
    env = {**os.environ, boot.ENV: "1",
           "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code, str(site_dir)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "workbench autopatch:" in ln]
    assert len(lines) == 1 and "fakeeng 1.2.3: applied elastic-pool" in lines[0], done.stderr
    assert lines[0].startswith("INFO ") and "[workbench.autopatch]" in lines[0]
