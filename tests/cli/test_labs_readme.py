"""labs/README.md agrees with ``workbench labs list`` and with the records in the repository:
its lab table names each lab's backends as the lab declares them, and its "where each lab ran"
table cites every committed record of a GPU run, each under its lab, its device and its date."""

from __future__ import annotations

import re
from pathlib import Path

from workbench.backends import BACKENDS
from workbench.labs import LABS, get_lab

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "labs" / "README.md"
WORD = re.compile(r"\b(" + "|".join(BACKENDS) + r")\b")
LINK = re.compile(r"\[record\]\(\.\./([^)]+)\)")
# h200-20261202/..., h200-vllm026-20261201.md: the device and the day of the run
WHEN = re.compile(r"(h\d+)-(?:[a-z0-9]+-)?(\d{4})(\d{2})(\d{2})")


def _tables() -> list[list[list[str]]]:
    tables, rows = [], []
    for line in README.read_text().splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _table(head: str) -> list[list[str]]:
    table = next(t for t in _tables() if t[0][-1] == head or t[0][3] == head)
    return [r for r in table[2:] if r[0].isdigit()]


def _lab_of(p: Path) -> str | None:
    """The lab a record's name (or its folder) names; None for a bench's record."""
    return next((n for n in sorted(LABS, key=len, reverse=True)
                 if n in p.stem or p.parent.parent.name == n.replace("-", "_")), None)


def _all_records() -> list[Path]:
    return [*ROOT.glob("docs/records/**/*.md"), *ROOT.glob("workbench/labs/*/records/*.md")]


def _records() -> dict[str, set[str]]:
    """Every committed lab record's Markdown, by the lab it names."""
    found: dict[str, set[str]] = {}
    for p in _all_records():
        if (lab := _lab_of(p)) is not None:
            found.setdefault(lab, set()).add(p.relative_to(ROOT).as_posix())
    return found


def test_a_record_of_no_lab_is_cited_by_the_docs():
    """A bench's record (no lab in its name) is cited where its bench is documented."""
    docs = "".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
    for p in _all_records():
        if _lab_of(p) is None:
            assert p.relative_to(ROOT).as_posix() in docs, p


def test_the_lab_table_names_the_backends_labs_list_gives():
    rows = _table("backends")
    assert [(r[0], r[1]) for r in rows] == [(f"{i:02d}", n) for i, n in enumerate(LABS)]
    for r in rows:
        said = list(dict.fromkeys(WORD.findall(r[3])))
        assert said == list(get_lab(r[1]).backends), (r[1], r[3])


def test_where_each_lab_ran_cites_every_record():
    rows = _table("ran on a GPU (committed records)")
    assert [r[1] for r in rows] == list(LABS)
    records = _records()
    assert records, "no committed records found"
    for r in rows:
        assert r[2] == ", ".join(get_lab(r[1]).backends), r
        cited = LINK.findall(r[3])
        assert set(cited) == records.get(r[1], set()), (r[1], cited)
        for part in r[3].split(";"):
            for path in LINK.findall(part):
                assert (ROOT / path).is_file(), path
                device, y, m, d = WHEN.search(path).groups()
                assert f"{device.upper()} {y}-{m}-{d}" in part, (r[1], part)
        if not cited:
            assert r[3] == "-", r
