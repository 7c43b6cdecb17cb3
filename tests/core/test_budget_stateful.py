"""The shared GPU budget's invariants under random charges, credits, deaths and reclaims.

Holders are handles on one budget file, each with its own identity: live ones are real
processes (this one, its parent, init) with their real start times; a dead one is this pid with
a start time it never had (what a reused pid looks like), so "died holding bytes" is exact."""

from __future__ import annotations

import os
import tempfile

import hypothesis.strategies as st
from hypothesis import settings as hsettings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from workbench.core.budget_segment import SharedBudget
from workbench.procs import proc_start_time

PAGE = 2 << 20
TOTAL = 16 * PAGE


def _live_identities() -> list[tuple[int, int]]:
    out = []
    for pid in dict.fromkeys((os.getpid(), os.getppid(), 1)):
        start = proc_start_time(pid)
        if start:
            out.append((pid, start))
    return out


class BudgetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        first = SharedBudget.open("gpu0", TOTAL, shm_dir=self.dir.name)
        assert first is not None
        self.handles: list[SharedBudget] = []
        self.model: dict[tuple[int, int], int] = {}  # identity -> bytes held
        self.alive: dict[tuple[int, int], bool] = {}
        for ident in _live_identities():
            self._add(ident, alive=True, handle=first if not self.handles else None)
        self.dead_starts = 0

    def _add(self, ident, alive: bool, handle: SharedBudget | None = None) -> None:
        h = handle or SharedBudget.open("gpu0", TOTAL, shm_dir=self.dir.name)
        h.me = ident
        self.handles.append(h)
        self.model[ident] = 0
        self.alive[ident] = alive

    def _reclaim_model(self, but: tuple[int, int] | None) -> None:
        for ident, alive in self.alive.items():
            if not alive and ident != but:
                self.model[ident] = 0

    @rule(k=st.integers(0, 10), pages=st.integers(1, 6))
    def charge(self, k: int, pages: int) -> None:
        h = self.handles[k % len(self.handles)]
        n = pages * PAGE
        ok = h.charge(n)
        if sum(self.model.values()) + n > TOTAL:  # a would-be miss reclaims the dead first
            self._reclaim_model(h.me)
        expect = sum(self.model.values()) + n <= TOTAL
        assert ok == expect
        if ok:
            self.model[h.me] += n

    @rule(k=st.integers(0, 10), pages=st.integers(1, 6))
    def credit(self, k: int, pages: int) -> None:
        h = self.handles[k % len(self.handles)]
        n = min(self.model[h.me], pages * PAGE)
        h.credit(n)
        self.model[h.me] -= n

    @precondition(lambda self: len(self.handles) < 12)
    @rule()
    def a_process_that_will_die(self) -> None:
        """A holder whose process is gone by the time anyone looks (pid reused)."""
        self.dead_starts += 1
        self._reclaim_model(None)  # attaching reclaims the holders already gone
        pid, start = os.getpid(), proc_start_time(os.getpid()) or 0
        self._add((pid, start + 10_000 + self.dead_starts), alive=False)

    @rule()
    def gc(self) -> None:
        freed = self.handles[0].reclaim()
        dead = sum(v for i, v in self.model.items() if not self.alive[i])
        assert freed == dead
        self._reclaim_model(self.handles[0].me)

    @invariant()
    def sum_of_holders_within_total(self) -> None:
        state = self.handles[0].state()
        assert state.held <= state.total == TOTAL
        held = {(x.pid, x.start): x.held for x in state.holders.values()}
        assert held == {i: v for i, v in self.model.items() if v}
        assert all(x.held > 0 for x in state.holders.values())  # an empty slot is freed

    @invariant()
    def mine_matches(self) -> None:
        h = self.handles[0]
        assert h.held_by_me() == self.model[h.me]

    def teardown(self) -> None:
        for h in self.handles:
            h.close()
        self.dir.cleanup()


BudgetMachine.TestCase.settings = hsettings(max_examples=40, stateful_step_count=30,
                                            deadline=None)
TestBudget = BudgetMachine.TestCase
