"""A child process driven line by line (``op n`` in, one answer out): the real processes that
race for one shared budget in the admission tests."""

from __future__ import annotations

import subprocess
import sys


class LineWorker:
    def __init__(self, code: str, *args: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        first = self.p.stdout.readline().split()
        assert first and first[0] == "ready", first

    def send(self, op: str, pages: int = 0) -> None:
        self.p.stdin.write(f"{op} {pages}\n")
        self.p.stdin.flush()

    def answer(self) -> str:
        return self.p.stdout.readline().strip()

    def ask(self, op: str, pages: int = 0) -> str:
        self.send(op, pages)
        return self.answer()

    def close(self) -> None:
        self.p.stdin.close()
        assert self.p.wait(timeout=60) == 0
