"""Every reference in the chapters, labs and quiz data can be opened inside the repository.

(a) no bare citation of a document outside the repository ("seed 000 §10", "003 E5",
    "research/…", a machine path): a citation is a Markdown link into ``docs/sources.md``;
(b) every ``docs/sources.md#anchor`` cited exists there, and every relative link's file exists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workbench.quiz.seal import open_quiz

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "docs" / "sources.md"
SCANNED = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("labs/*.ipynb"),
                  *ROOT.glob("workbench/quiz/data/*.json"), ROOT / "labs" / "README.md"])

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
# a code cell cites as `000 §2 (docs/sources.md#seed-000-s2)`: the path follows the label
CODE_CITE = re.compile(r"\b00[013] (?:§[\d.]+|E\d+) \((?:\.\./)?docs/sources\.md#[\w-]+\)")
CITED = re.compile(r"sources\.md#([\w-]+)")
BARE = {
    "a source document by its seed number": re.compile(r"(?i)\bseeds?[ -]?0\d\d\b"),
    "a section or experiment of a source document": re.compile(r"\b00[013] ?(?:§|E\d)"),
    "a section sign outside a link": re.compile(r"§ ?\d"),
    "the research notes": re.compile(r"(?i)\bresearch/|\bkvcached\.md\b|\banchors\.md\b"),
    "the source documents' folder": re.compile(r"(?i)\bshared/(?:seeds|research)\b"),
    "a machine path": re.compile(r"(?<![\w.])/(?:work|home|Users)/"),
}
ANCHOR_FORMS = re.compile(r"seed-00[013]-(?:s\d+(?:-\d+)?|e\d)|seed-00[013]"
                          r"|upstream-[a-z0-9]+-[a-z0-9-]+|research-kvcached-[a-z0-9-]+")


def _texts(path: Path) -> list[tuple[str, str]]:
    """(where, text) pairs: a notebook's cells, a quiz file's strings, a Markdown file."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return [(f"cell {i} ({c.get('id')}){'' if c['cell_type'] == 'markdown' else ' code'}",
                 "".join(c["source"])) for i, c in enumerate(cells)]
    if path.suffix == ".json":
        out: list[tuple[str, str]] = []

        def walk(x, where):
            if isinstance(x, dict):
                for k, v in x.items():
                    walk(v, f"{where}.{k}" if where else k)
            elif isinstance(x, list):
                for i, v in enumerate(x):
                    walk(v, f"{where}[{i}]")
            elif isinstance(x, str):
                out.append((where, x))

        walk(open_quiz(json.loads(path.read_text())), "")  # sealed feedback cites too
        return out
    return [("", path.read_text())]


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([^"]+)"', SOURCES.read_text()))


def _base(path: Path) -> Path:
    # quiz feedback is shown inside a chapter notebook, so it links as the chapters do
    return ROOT / "chapters" if path.suffix == ".json" else path.parent


def bare_references(path: Path) -> list[str]:
    found = []
    for where, text in _texts(path):
        rest = LINK.sub(" ", CODE_CITE.sub(" ", text))
        for what, pat in BARE.items():
            for m in pat.finditer(rest):
                s = max(0, m.start() - 40)
                found.append(f"{where}: {what}: …{rest[s:m.end() + 40]}…")
    return found


def broken_links(path: Path) -> list[str]:
    known, bad = anchors(), []
    for where, text in _texts(path):
        for anchor in CITED.findall(text):
            if anchor not in known:
                bad.append(f"{where}: no anchor #{anchor} in docs/sources.md")
        if where.endswith(" code"):
            continue  # brackets in code are indexing, not links
        for _label, target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor on the same page
            file = (_base(path) / target.split("#")[0]).resolve()
            if target.startswith("/") or not file.is_relative_to(ROOT):
                bad.append(f"{where}: {target} points outside the repository")
            elif not file.exists():
                bad.append(f"{where}: {target} does not exist")
    return bad


def _id(p: Path) -> str:
    return str(p.relative_to(ROOT))


@pytest.mark.parametrize("path", SCANNED, ids=_id)
def test_no_reference_to_a_document_outside_the_repository(path):
    found = bare_references(path)
    assert not found, f"{_id(path)}:\n" + "\n".join(found)


@pytest.mark.parametrize("path", SCANNED, ids=_id)
def test_every_cited_anchor_and_link_exists(path):
    bad = broken_links(path)
    assert not bad, f"{_id(path)}:\n" + "\n".join(bad)


def test_anchors_have_the_agreed_forms_and_are_unique():
    ids = re.findall(r'<a id="([^"]+)"', SOURCES.read_text())
    assert len(ids) == len(set(ids)) > 80
    assert [a for a in ids if not ANCHOR_FORMS.fullmatch(a)] == []


def test_every_section_cited_by_the_labs_today_has_an_entry():
    # the lab notebooks cite these handbook/experiment sections; their links must resolve
    need = {"seed-000-s4-2", "seed-000-s6-3", "seed-000-s9-2", "seed-000-s10-2",
            "seed-000-s11-3", "seed-000-s12-4", "seed-000-s13-3", "seed-000-s14-3",
            "seed-000-s15-3", "seed-001-s13", "seed-003-e1", "seed-003-e9", "seed-003-s12",
            "upstream-kvcached-colocation", "upstream-kvcached-idle-footprint"}
    assert need <= anchors()


def test_the_checker_catches_what_it_should():
    fake = ROOT / "tests" / "chapters" / "_probe.md"
    try:
        fake.write_text("as seed 000 §10 says; see 003 E5, research/kvcached.md and §4.\n"
                        "[ok](../../docs/sources.md#seed-000-s10)"
                        " [gone](../../docs/sources.md#nope) [away](/home/learner/seeds/x.txt)\n")
        kinds = {b.split(": ")[1] for b in bare_references(fake)}
        assert kinds == set(BARE) - {"the source documents' folder", "a machine path"}, kinds
        assert len(broken_links(fake)) == 2
        fake.write_text("notes in /home/learner/shared/seeds and shared/research/kvcached\n")
        kinds = {b.split(": ")[1] for b in bare_references(fake)}
        assert {"the source documents' folder", "a machine path"} <= kinds
    finally:
        fake.unlink()


def test_quiz_feedback_renders_its_citations_as_links():
    from workbench.quiz.widget import inline_html

    out = inline_html("as [001 §13](../docs/sources.md#seed-001-s13) says, a <b> stays text")
    assert "<a href='../docs/sources.md#seed-001-s13' target='_blank'>001 §13</a>" in out
    assert "&lt;b&gt;" in out and "](" not in out
