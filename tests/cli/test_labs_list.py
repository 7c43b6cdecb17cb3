"""``labs list`` shows every lab's backends in one order, the registry's (sim, host, gpu)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from workbench.backends import BACKENDS
from workbench.cli import app


def test_backends_in_the_registry_order():
    res = CliRunner().invoke(app, ["labs", "list", "--json"])
    assert res.exit_code == 0, res.output
    for row in json.loads(res.stdout):
        assert row["backends"] == sorted(row["backends"], key=BACKENDS.index), row
