"""Report cells read as values, not as Python: every lab's Markdown goes through one pass
(``LabResult`` -> ``tidy_tables``) that writes a dict, list, bool or None in words and a
one-value spread as its value."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from workbench.labs import get_lab, run_lab
from workbench.labs.kit.report import tidy_cell, tidy_tables

REPR = re.compile(r"\{'|\[None|\bTrue\b|\bFalse\b|\bNone\b|'\]")


def test_reprs_become_words():
    assert tidy_cell(" {'prepare': 1, 'commit': 0} ") == " prepare: 1, commit: 0 "
    assert tidy_cell("[None, None, 8, None]") == "-, -, 8, -"
    assert tidy_cell(" True ") == " yes " and tidy_cell("False") == "no"
    assert tidy_cell(" 1.263 [1.263-1.263] ") == " 1.263 "
    assert tidy_cell("2.1x [2.1-2.1] / 3 [2-4]") == "2.1x / 3 [2-4]"
    assert tidy_cell(" 1.0x [0.98-1.21] ") == " 1.0x [0.98-1.21] "  # a real spread stays


def test_prose_and_code_stay_as_written():
    md = "Mapped after: {'a': [0]}\n\n```\n| {'a': 1} |\n```\n| x | y |\n|---|---|\n| True | [1] |"
    assert tidy_tables(md).splitlines()[0] == "Mapped after: {'a': [0]}"
    assert "| {'a': 1} |" in tidy_tables(md)
    assert tidy_tables(md).splitlines()[-1] == "| yes | 1 |"


@given(st.lists(st.one_of(st.none(), st.booleans(), st.integers(-99, 99)), min_size=1,
                max_size=5))
def test_a_list_cell_never_shows_python(values):
    out = tidy_cell(f" {values!r} ")
    assert not REPR.search(out) and out.count(",") == len(values) - 1


def test_lab_reports_have_no_python_in_their_cells():
    for name in ("tp-pp", "tiered-retrieval", "dynamic-limit"):
        lab = get_lab(name)
        md = run_lab(name, lab.params(quick=True), "sim").markdown
        cells = [ln for ln in md.splitlines() if ln.startswith("|")]
        assert cells and not any(REPR.search(ln) for ln in cells), name
