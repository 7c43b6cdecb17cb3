"""Quiz keys out of sight: every packaged quiz is sealed, no key text lies in the served tree,
the seal opens to exactly what was sealed, and a tampered file is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.quiz.schema import load_quiz, parse_quiz
from workbench.quiz.seal import SEALED, SealError, mark, open_quiz, seal_quiz

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = sorted((ROOT / "workbench" / "quiz").glob("*data/*.json"))


def _served_text() -> str:
    """Every tracked text file JupyterLab serves a learner (the repository), tests aside: they
    hold keys on purpose, as fixtures."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    out = []
    for name in files:
        if not name.startswith("tests/") and Path(ROOT / name).is_file():
            out.append((ROOT / name).read_text(encoding="utf-8", errors="ignore"))
    return "\n".join(out)


def test_every_packaged_quiz_is_sealed():
    assert len(PACKAGED) > 20
    for path in PACKAGED:
        d = json.loads(path.read_text())
        assert d["sealed"] == SEALED, path.name
        assert '"correct"' not in path.read_text() and "explanation" not in path.read_text()


def test_no_feedback_is_readable_anywhere_in_the_served_tree():
    served = _served_text()
    leaked = []
    for path in PACKAGED:
        for q in load_quiz(path).questions:
            # the feedback is what says which choice is right (an explanation may repeat
            # the chapter's own lesson, which gives no choice away)
            texts = [*(c.feedback for c in q.choices), *((q.feedback or {}).values())]
            leaked += [f"{q.id}: {t[:50]}" for t in texts if len(t) > 30 and t in served]
    assert leaked == []


open_choice = st.fixed_dictionaries({"text": st.text(min_size=1), "correct": st.booleans(),
                                     "feedback": st.text(min_size=1)})


@given(st.lists(open_choice, min_size=2, max_size=5, unique_by=lambda c: c["text"]),
       st.text(min_size=1), st.text(alphabet="0123456789abcdef", min_size=4, max_size=16))
def test_a_sealed_question_opens_to_what_was_sealed(choices, explanation, salt):
    q = {"id": "q1", "kind": "multiple", "prompt": "p", "explanation": explanation,
         "choices": choices}
    d = {"chapter": "02", "title": "t", "questions": [q]}
    sealed = seal_quiz(d, salt)
    assert open_quiz(sealed) == {"chapter": "02", "title": "t", "questions": [q]}
    assert "correct" not in json.dumps(sealed)


def test_a_numeric_key_is_sealed_and_opens():
    q = {"id": "n", "kind": "numeric", "prompt": "how many?", "explanation": "because",
         "answer": 64, "tolerance": 0.5, "unit": "blocks",
         "feedback": {"correct": "yes", "low": "more", "high": "fewer"}}
    sealed = seal_quiz({"chapter": "01", "title": "t", "questions": [q]}, "abcd")
    (sq,) = sealed["questions"]
    assert set(sq) == {"id", "kind", "prompt", "unit", "key"}
    assert parse_quiz(open_quiz(sealed)).questions[0].answer == 64


def test_a_tampered_mark_or_key_is_refused_in_one_line():
    d = {"chapter": "02", "title": "t", "questions": [
        {"id": "a", "kind": "single", "prompt": "p", "explanation": "e", "choices": [
            {"text": "x", "correct": True, "feedback": "f"},
            {"text": "y", "correct": False, "feedback": "g"}]}]}
    sealed = seal_quiz(d, "s1")
    assert sealed["questions"][0]["choices"][0]["mark"] == mark("s1", "a", 0, True)
    bad = json.loads(json.dumps(sealed))
    bad["questions"][0]["choices"][1]["mark"] = "0" * 16
    with pytest.raises(SealError, match="matches neither"):
        open_quiz(bad)
    bad = json.loads(json.dumps(sealed))
    bad["questions"][0]["key"] = "not base64!"
    with pytest.raises(SealError, match="cannot be opened"):
        open_quiz(bad)


def test_the_authoring_round_trip_keeps_the_salt(tmp_path):
    src = PACKAGED[0]
    sealed = tmp_path / "sealed.json"
    sealed.write_text(src.read_text())
    shown = subprocess.run([sys.executable, "-m", "workbench.quiz", "open", str(sealed)],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout
    opened = tmp_path / "open.json"
    opened.write_text(shown)
    subprocess.run([sys.executable, "-m", "workbench.quiz", "close", str(opened), str(sealed)],
                   check=True, cwd=ROOT)
    assert json.loads(sealed.read_text()) == json.loads(src.read_text())
    assert load_quiz(sealed) == load_quiz(src)
