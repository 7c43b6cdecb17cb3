"""No fake enable on a real vLLM (seed 000 §5): three real starts, each judged by the same four
checks, two of them real CLI calls in processes of their own.

* ``elastic``      the switch on and the autopatch ``.pth`` active in the server's interpreter;
* ``pth-skipped``  the switch on (every ``WORKBENCH_KV_*`` set) but the ``.pth`` never runs: the
  server's interpreter starts with site processing off (``-S``), vLLM's packages reached through
  ``PYTHONPATH`` -- what an interpreter sees whose site-packages holds no
  ``workbench_autopatch.pth`` (a user who never ran ``python -m workbench.adapters.pth
  install`` there); vLLM starts and serves, unpatched;
* ``stock``        the switch off.

Checks: *served* (every request answered in full), *autopatch switch* (``workbench doctor
--json`` from the server's own interpreter and environment), *patch log* (the "workbench
autopatch: ... applied" line in the server's log) and *control segment* (``workbench kvctl list
--json`` while the wave runs: a live segment owned by the server's processes, blocks in use).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

from workbench.engines.real.client import Sampling
from workbench.engines.real.procs import descendants
from workbench.engines.real.vllm import REPO, VllmEngine
from workbench.engines.sched.request import Request
from workbench.labs.kit import server_rig as rig

ARMS = ("elastic", "pth-skipped", "stock")
CHECKS = ("served", "autopatch switch", "patch log", "control segment")
EXPECTED_FAIL = {"elastic": (), "pth-skipped": ("patch log", "control segment"),
                 "stock": ("autopatch switch", "patch log", "control segment")}
SERVER = "vllm.entrypoints.openai.api_server"
PATCH_LINE = "workbench autopatch:"


def site_paths(python: str) -> list[str]:
    """The folders ``python`` imports from once site processing has run (its site-packages and
    what their path lines add), for an interpreter started without it."""
    code = "import os, sys; print(os.pathsep.join(p for p in sys.path if os.path.isdir(p)))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return [p for p in done.stdout.strip().split(os.pathsep) if p]


def interpreter(eng: VllmEngine) -> list[str]:
    """The server's interpreter as it was started (``python`` or ``python -S``)."""
    cmd = eng.spec.server_cmd or [eng.spec.python or sys.executable]
    return cmd[:cmd.index("-m")] if "-m" in cmd else cmd[:1]


def _cli(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """A real ``workbench`` command in a process of its own: exit code and parsed JSON."""
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        out = None
    return {"rc": done.returncode, "json": out, "stderr": done.stderr.strip()[-400:]}


def doctor(eng: VllmEngine) -> dict[str, Any]:
    """``workbench doctor --json`` from the server's interpreter with the server's environment:
    what an operator asks on the serving host."""
    got = _cli([*interpreter(eng), "-m", "workbench", "doctor", "--json"], eng.env())
    m = got["json"] or {}
    v = (m.get("engines") or {}).get("vllm") or {}
    return {"rc": got["rc"], "config": m.get("config"), "python": m.get("python"),
            "vllm": {"installed": v.get("installed"), "version": v.get("version"),
                     "would_apply": sum(p["status"] == "would apply"
                                        for p in v.get("patches", []))},
            "stderr": got["stderr"] if got["rc"] else ""}


def kvctl_list() -> dict[str, Any]:
    """``workbench kvctl list --json`` as an operator runs it (this project's interpreter)."""
    got = _cli([sys.executable, "-m", "workbench", "kvctl", "list", "--json"], dict(os.environ))
    return {"rc": got["rc"], "segments": got["json"] or [], "stderr": got["stderr"]}


def patch_lines(eng: VllmEngine) -> list[str]:
    try:
        text = eng.log.read_text(errors="replace")
    except OSError:
        return []
    return [ln.strip()[-300:] for ln in text.splitlines() if PATCH_LINE in ln]


def _engines(backend: str, model: str, py: str, root, n: int) -> dict[str, VllmEngine]:
    bare = {"PYTHONPATH": os.pathsep.join([str(REPO), *site_paths(py)])}
    kw = {"max_num_seqs": n, "prefix_caching": False}
    return {"elastic": rig.engine("nfe-elastic", backend, model, py, root, elastic=True, **kw),
            "pth-skipped": rig.engine("nfe-nopth", backend, model, py, root, elastic=True,
                                      server_cmd=[py, "-S", "-m", SERVER], env=bare, **kw),
            "stock": rig.engine("nfe-stock", backend, model, py, root, elastic=False, **kw)}


def _feed(engs: dict[str, VllmEngine], prompts: list[list[int]], tokens: int,
          stop: threading.Event, sent: dict[str, list[Request]]) -> None:
    """Keep ``len(prompts)`` requests in flight on every engine until ``stop``."""
    rid = 0
    while not stop.is_set():
        for arm, eng in engs.items():
            live = sum(1 for r in sent[arm] if r.finish is None and r.state.value != "rejected")
            for _ in range(len(prompts) - live):
                r = Request(rid=rid, prompt=prompts[rid % len(prompts)], max_new_tokens=tokens)
                rid += 1
                sent[arm].append(r)
                eng.submit([r])
        stop.wait(0.02)


def _wave(engs: dict[str, VllmEngine], prompts: list[list[int]], tokens: int) -> dict:
    """Traffic on every engine at once; ``kvctl list`` while the elastic pool has blocks in
    use (requests kept in flight until it answered); each arm's own segment rows (owned by its
    server's processes)."""
    for eng in engs.values():
        eng.sampling = eng._sender.sampling = Sampling()
    sent: dict[str, list[Request]] = {arm: [] for arm in engs}
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(engs, prompts, tokens, stop, sent),
                              daemon=True)
    feeder.start()
    try:
        end = time.monotonic() + 120
        while engs["elastic"].kv_pool.used_blocks == 0 and time.monotonic() < end:
            time.sleep(0.05)
        mid = {arm: eng.kv_pool.info() for arm, eng in engs.items()}
        listed = kvctl_list()
    finally:
        stop.set()
        feeder.join()
    out = {}
    for arm, eng in engs.items():
        eng.advance()
        got = [eng.outcome(r.rid) for r in sent[arm]]
        pids = {eng.process.pid, *descendants(eng.process.pid)}
        info = mid[arm]
        out[arm] = {"requests": len(got), "max_tokens": tokens,
                    "finished": sum(1 for o in got if not o.error and len(o.token_ids) == tokens),
                    "lost": [o.error for o in got if o.error][:3],
                    "pids": sorted(pids), "ipc_name": eng.ipc_name or None,
                    "segments": [s for s in listed["segments"] if s.get("owner_pid") in pids],
                    "pool_mapped_mid": info.mapped if info else None,
                    "pool_used_blocks_mid": info.used_blocks if info else None}
    return {"kvctl_list": {"rc": listed["rc"], "stderr": listed["stderr"],
                           "count": len(listed["segments"])}, "arms": out}


def run(backend: str, quick: bool = False) -> dict[str, Any]:
    py = rig.python_for("no-fake-enable")
    root = rig.workroot()
    n, tokens = (4, 48) if quick else (8, 128)
    engs: dict[str, VllmEngine] = {}
    try:
        engs = _engines(backend, rig.model_dir(py, root), py, root, n)
        t0 = time.monotonic()
        rig.start_all(list(engs.values()))
        started_s = round(time.monotonic() - t0, 1)
        docs = {arm: doctor(eng) for arm, eng in engs.items()}
        wave = _wave(engs, rig.prompts(n, shared=0, tail=160, seed=3), tokens)
        for arm, eng in engs.items():
            row = wave["arms"][arm]
            row.update(doctor=docs[arm], patch_log=patch_lines(eng),
                       interpreter=interpreter(eng), elastic_env=eng.spec.elastic)
        return {"backend": backend, "device": rig.device_of(backend), "start_s": started_s,
                "kvctl_list": wave["kvctl_list"], "arms": wave["arms"]}
    finally:
        for eng in engs.values():
            eng.close()
        shutil.rmtree(root, ignore_errors=True)
