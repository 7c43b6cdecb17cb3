"""``doctor`` speaks the command line: a backend's fix as options (``--backend sim``, not
``backend="sim"``), and ``--check`` says so when there is no engine to check."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from workbench.cli import app
from workbench.cli.doctor import manifest

KWARG = re.compile(r"\b[a-z_]+=(['\"])")


def test_fixes_are_options_and_check_is_never_silent():
    res = CliRunner().invoke(app, ["doctor", "--check"])
    fixes = [ln for ln in res.stdout.splitlines() if "Fix:" in ln]
    assert not any(KWARG.search(ln) for ln in fixes), fixes
    m = manifest()
    unusable = [b for b in m["backends"] if not b["usable"]]
    if unusable:  # this host lacks a backend (gpu on a CPU box): its fix is shown as options
        assert fixes and all("--" in ln.split("Fix:", 1)[1] for ln in fixes), fixes
    if not any(e["installed"] for e in m["engines"].values()):
        assert "no engine is installed here" in res.stdout
