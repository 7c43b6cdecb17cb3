"""The faults lab's four cases (seed 000 §12), each on a fresh TP worker set.

Every case runs the same script around one injected fault: start (page 0, the null block's,
mapped), allocate page 1 on every rank, arm the fault, run the operation it hits, then let the
pool clean up (``trim``; a failed pool refuses that), stop the workers. At each point it reads
what every rank maps and holds from the workers themselves, and it keeps the coordinator's
messages of the faulty operation for the sequence diagram.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from workbench.core.coordinator import WorkerId
from workbench.errors import ConfigError, WorkbenchError
from workbench.labs.kit.tp_pp_workers import BPP, GEO, Rig, open_rig, shm_entries, wid

CASES = ("map-failure", "prepare-failure", "lost-commit-reply", "killed-process")


def _map_failure(rig: Rig, kv: Any, ids: list[int], victim: WorkerId) -> dict[str, Any]:
    rig.fail_device(victim, "create")  # the victim cannot create page 2's memory
    return {"op": "alloc (needs page 2)", "result": "refused (None)" if kv.alloc(BPP) is None
            else "granted", "live": ids}


def _prepare_failure(rig: Rig, kv: Any, ids: list[int], victim: WorkerId) -> dict[str, Any]:
    rig.fail_device(victim, "unmap")  # the victim's prepare (unmap, keep handles) fails
    kv.free(ids)  # page 1 empties: its unmap transaction starts
    return {"op": "free (page 1 empties)", "result": "freed"}


def _lost_commit(rig: Rig, kv: Any, ids: list[int], victim: WorkerId) -> dict[str, Any]:
    rig.drop_reply(victim, "commit")  # the victim commits, its reply never arrives
    kv.free(ids)
    return {"op": "free (page 1 empties)", "result": "freed"}


def _killed(rig: Rig, kv: Any, ids: list[int], victim: WorkerId) -> dict[str, Any]:
    pid = rig.kill(victim)  # no cleanup runs in the victim: SIGKILL (sim: crash)
    out: dict[str, Any] = {"op": "alloc (needs page 2)", "victim_pid": pid,
                           "victim_socket_left": f"w{victim.tp}.sock" in rig.socket_files()}
    if pid is not None:
        out["victim_exit_code"] = rig.group.procs[victim].returncode
    try:
        out["result"] = "granted" if kv.alloc(BPP) is not None else "refused (None)"
    except WorkbenchError as err:
        out["result"] = f"{type(err).__name__}"
    return out


FAULTS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "map-failure": ("the next create on the last rank fails", _map_failure),
    "prepare-failure": ("the last rank's unmap (prepare) fails", _prepare_failure),
    "lost-commit-reply": ("the last rank's commit reply is lost", _lost_commit),
    "killed-process": ("the last rank's process is SIGKILLed (sim: crashes)", _killed),
}


def _snapshot(rig: Rig, kv: Any) -> dict[str, Any]:
    states = rig.states()
    held = rig.held()
    return {"mapped": rig.mapped(), "held": held,
            "retained": {wid(t): (s["retained"] if s else []) for t, s in states.items()},
            "pending": {wid(t): (s.get("pending") if s else None) for t, s in states.items()},
            "unbacked": {w: (h - GEO.page_id_bytes * len(rig.mapped()[w]) if h is not None
                             else None) for w, h in held.items()},
            "page1": kv.pages.state[1].value, "page2": kv.pages.state[2].value,
            "pool_failed": kv.pages.failed or "", "quarantined": sorted(kv.space.quarantined)}


def _cleanup_messages(msgs: list) -> list[str]:
    """The coordinator's undo traffic in the faulty operation: rollbacks, aborts, retries."""
    out = [f"{m.src} -> {m.dst}: {m.label}" for m in msgs
           if m.label.startswith(("UNMAP", "ABORT"))]
    commits: dict[str, int] = {}
    for m in msgs:
        if m.label.startswith("COMMIT"):
            commits[m.dst] = commits.get(m.dst, 0) + 1
    out += [f"coordinator -> {w}: COMMIT sent {n} times (retried)" for w, n in commits.items()
            if n > 1]
    return out


def run_case(backend: str, case: str, tp: int = 2,
             gpus: int | None = None) -> dict[str, Any]:
    """One fault case, start to finish (see the module doc)."""
    what, inject = FAULTS[case]
    victim = WorkerId(0, tp - 1)
    rig = open_rig(backend, tp, 1, name=f"f-{case[:8]}", gpus=gpus)
    other = (open_rig(backend, tp, 1, name="f-other", gpus=gpus) if case == "killed-process"
             else None)
    out: dict[str, Any] = {"case": case, "fault": what, "tp": tp, "victim": wid(victim)}
    pids = rig.pids() | (other.pids() if other is not None else set())
    try:
        kv = rig.pool()
        out["start"] = _snapshot(rig, kv)
        ids = kv.alloc(BPP)  # page 1 on every rank
        out["before"] = _snapshot(rig, kv)
        rig.take()
        live = inject(rig, kv, ids, victim)
        out |= {k: v for k, v in live.items() if k != "live"}
        out["messages"] = rig.take()
        out["after"] = _snapshot(rig, kv)
        out["events"] = [f"page {e.page}: {e.src} -> {e.dst} ({e.cause.split(':')[0]})"
                         for e in kv.events]
        out["cleaned_up"] = _cleanup_messages(out["messages"])
        if kv.pages.failed:
            out["pool_cleanup"] = "none: a failed pool refuses work; its workers are stopped"
        else:  # the pool's own cleanup: free what is still live, unmap every empty page
            kv.free(live.get("live", []))
            kv.trim()
            out["pool_cleanup"] = "free the live blocks, trim" if live.get("live") else "trim"
        out["end"] = _snapshot(rig, kv)
        if other is not None:
            okv = other.pool()
            got = okv.alloc(2 * BPP)
            out["other_instance_ok"] = got is not None and not okv.pages.failed
            okv.free(got or [])
            okv.close()
    finally:
        if other is not None:
            other.close()
        out |= {"after_shutdown": rig.close()}
    if out.get("victim_socket_left") and not out["after_shutdown"]["socket_dir_left"]:
        out["pool_cleanup"] += "; the group's shutdown removed the socket file SIGKILL left"
    out["shm_left"] = shm_entries(pids)
    return out


def coordinator_killed(backend: str) -> dict[str, Any]:
    """Seed §12.4's other half: the coordinator is SIGKILLed; its workers notice their parent
    is gone and leave; ``gc_sockets`` removes the directory nothing cleaned up."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from workbench.transport import gc_sockets

    code = ("import time\nfrom workbench.labs.kit.tp_pp_workers import GEO\n"
            "from workbench.transport import WorkerGroup\n"
            f"g = WorkerGroup(GEO, tp=2, name='doomed', backend={backend!r})\n"
            "g.space().map_page(2)\nprint(g.dir, flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        line = proc.stdout.readline().strip()  # its pool directory, once its workers listen
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        err = "" if line else proc.stderr.read()[-300:]
        proc.stdout.close()
        proc.stderr.close()
    if not line:
        raise ConfigError("the coordinator process of the SIGKILL case",
                          f"exited before its workers listened ({err!r})",
                          "check that `workbench labs run tp-pp --backend "
                          f"{backend}` works here")
    doomed = Path(line)
    out: dict[str, Any] = {"dir_after_kill": doomed.is_dir()}
    deadline = time.monotonic() + 60
    while list(doomed.rglob("*.sock")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the orphaned workers exit and remove their own sockets
    out["workers_left_sockets"] = len(list(doomed.rglob("*.sock")))
    out["dir_before_gc"] = doomed.is_dir()
    out["gc_removed_it"] = str(doomed) in gc_sockets()
    out["dir_after_gc"] = doomed.exists()
    return out
