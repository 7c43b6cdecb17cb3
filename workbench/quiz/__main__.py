"""``python -m workbench.quiz open SEALED`` prints a packaged quiz in its open form (the schema of
:mod:`workbench.quiz.schema`); ``close OPEN SEALED`` checks an open file and writes it sealed,
keeping the salt of a sealed file already there, so an edit changes only its own question."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from workbench.outfiles import check, run_main, write_text
from workbench.quiz.schema import parse_quiz
from workbench.quiz.seal import open_quiz, seal_quiz


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "open":
        print(json.dumps(open_quiz(json.loads(Path(argv[1]).read_text())), indent=1,
                         ensure_ascii=False))
        return 0
    if len(argv) == 3 and argv[0] == "close":
        d = json.loads(Path(argv[1]).read_text())
        parse_quiz(d, where=argv[1])  # a broken quiz is refused before it is sealed
        target = check(argv[2], "SEALED")
        old = json.loads(target.read_text()) if target.exists() else {}
        sealed = seal_quiz(d, old.get("salt") if isinstance(old, dict) else None)
        write_text(target, json.dumps(sealed, indent=1, ensure_ascii=False) + "\n", "SEALED")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(run_main(main, sys.argv[1:]))
