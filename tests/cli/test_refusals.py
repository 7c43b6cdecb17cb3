"""Every refusal is one ``error:`` line that ends in a ``Fix:``, whichever layer raised it (the
control plane, a lab's parameters, click's usage check)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from workbench.cli import app

REFUSED = [
    ["kvctl", "delete", "nosuch_pool"],
    ["kvctl", "limit", "nosuch_pool", "8M"],
    ["kvctl", "limit-percent", "nosuch_pool", "50"],
    ["kvctl", "limit", "nosuch_pool", "abc"],
    ["kvctl", "export", "--port", "99999"],
    ["labs", "run", "nosuch"],
    ["labs", "run", "99"],
    ["labs", "run", "02", "--param", "foo=1"],
    ["labs", "run", "02", "--param", "seed"],
    ["labs", "run", "14"],
    ["kvtop", "--width", "0"],
    ["replay", "/nonexistent/trace.jsonl"],
]


@pytest.mark.parametrize("argv", REFUSED, ids=[" ".join(a) for a in REFUSED])
def test_a_refusal_is_one_line_with_its_fix(argv):
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Fix: " in lines[0] and "''" not in lines[0], lines[0]
