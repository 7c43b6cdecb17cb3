"""Statements the lab notebooks got wrong, held corrected."""

from __future__ import annotations

import re

import pytest

nbformat = pytest.importorskip("nbformat", reason="no notebook stack here (make setup)")

from .test_lab_notebooks import ROOT  # noqa: E402

LABS = ROOT / "labs"


def _text(stem: str, kind: str = "markdown") -> str:
    nb = nbformat.read(LABS / f"{stem}.ipynb", as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == kind)


def test_tp_ranks_hold_shards_not_copies():
    """Under TP each rank holds a shard of the KV heads (chapter 06), not a copy of the range."""
    text = _text("12_tp_pp")
    assert "copy of the KV range" not in text and "own copy" not in text
    assert re.search(r"shard of the KV heads", text)


def test_colocation_verdict_is_read_from_the_record():
    """Lab 00's prose never labels the run itself: it quotes the record's verdict and prints the
    per-PEAK comparison with kvcached's table that a verdict on the shape must follow from."""
    text, code = _text("00_colocation"), _text("00_colocation", "code")
    assert not re.search(r"\bsupported\b", text, re.I)
    assert "result.record.verdict" in text and "record.verdict" in code
    assert '"kvcached"' in code and "agrees" in code  # the comparison is printed


def test_non_prefix_reuse_names_its_host_backend():
    """Lab 19 runs on sim and on host: sim is not "the only backend this lab has"."""
    text = _text("19_non_prefix_reuse")
    assert "only backend" not in text
    assert '`backend = "host"`' in text


@pytest.mark.parametrize("path", sorted(LABS.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem)
def test_only_backend_claims_match_the_lab(path):
    from workbench.labs import get_lab

    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    name = re.search(r'run_lab\("([\w-]+)"',
                     "\n".join(c.source for c in nb.cells if c.cell_type == "code")).group(1)
    if re.search(r"only backend", text):
        assert get_lab(name).backends == ("sim",), path.name
