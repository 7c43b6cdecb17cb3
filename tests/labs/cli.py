"""Running a lab through the real CLI, as the lab tests do once each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from workbench.cli import app


def run_lab_cli(out: Path, name: str, *flags: str, **params: str) -> dict[str, Any]:
    """``workbench labs run NAME FLAGS --param K=V ... --out OUT``; fails the test on a nonzero
    exit (with the CLI's output), else returns the record it wrote to ``out``."""
    args = ["labs", "run", name, *flags]
    for key, value in params.items():
        args += ["--param", f"{key}={value}"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())
