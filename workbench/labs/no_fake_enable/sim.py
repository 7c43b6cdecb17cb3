"""No fake enable (seed 000 §5, experiment 1): is elastic KV really active, or does the service
merely start? The seed's point: a port that answers is no evidence; the switches, the memory and
the control plane must all show it at once.

Four arms, each one thing away from the first (seed 003 §2):

* ``enabled``        ``WORKBENCH_KV_AUTOPATCH=1`` and ``WORKBENCH_KV_IPC_NAME`` set, the patch
  takes: the engine's KV is an elastic pool with a control segment;
* ``autopatch-off``  the switch unset: the engine keeps its native allocator (a static split);
* ``patch-not-applied``  the switch on, but the patch never took (an engine version the plans
  refuse, the ``.pth`` missing from the engine's interpreter): native static split again;
* ``no-ipc-name``    the switch on, the patch taken, no IPC name: elastic, but nothing outside
  the process can see or limit it.

Each arm runs the same traffic (idle, a Poisson burst, idle) on a simulated vLLM-like
Llama-3.1-8B and is judged by the same five checks (:data:`CHECKS`). Two of them ask real
commands in a subprocess with the arm's environment: ``workbench doctor --json`` (the autopatch
switch) and ``workbench kvctl list --json`` (the control segment, read while the burst runs).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import simpy

from workbench.backends import make_device
from workbench.config import PoolConfig
from workbench.core.device import Device
from workbench.engines.metrics import summarize
from workbench.engines.models import get_model
from workbench.engines.sim.kvsetup import InstanceKV, elastic_pool, static_pool
from workbench.engines.sim.steptime import StepTimeModel
from workbench.engines.sim.vllm_like import VLLMLikeEngine, VLLMOptions
from workbench.engines.sim.workloads import poisson
from workbench.errors import ControlError
from workbench.labs.kit.base import Progress
from workbench.units import GiB

if TYPE_CHECKING:
    from workbench.labs.no_fake_enable.params import NoFakeEnableParams

AUTOPATCH, IPC = "WORKBENCH_KV_AUTOPATCH", "WORKBENCH_KV_IPC_NAME"
ARMS = ("enabled", "autopatch-off", "patch-not-applied", "no-ipc-name")
CHECKS = ("served", "autopatch switch", "elastic pool", "mapped grows with load",
          "control segment")
MODEL, SPLIT_GIB, DEVICE_GIB = "llama-3.1-8b", 6.0, 24.0
IDLE_S = 2.0  # idle before and after the burst


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    env: dict[str, str]  # the WORKBENCH_KV_* variables this arm's processes see
    patch_takes: bool  # whether the engine's allocator is really replaced


def arms(prefix: str) -> dict[str, Arm]:
    name = f"{prefix}-kv"
    return {a.name: a for a in (
        Arm("enabled", {AUTOPATCH: "1", IPC: name}, True),
        Arm("autopatch-off", {IPC: name}, True),
        Arm("patch-not-applied", {AUTOPATCH: "1", IPC: name}, False),
        Arm("no-ipc-name", {AUTOPATCH: "1"}, True))}


def _child_env(arm: Arm) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (AUTOPATCH, IPC)}
    return {**env, **arm.env}


def _workbench(args: list[str], arm: Arm) -> subprocess.Popen:
    """A real ``workbench`` command in another process with the arm's environment."""
    return subprocess.Popen([sys.executable, "-m", "workbench", *args], env=_child_env(arm),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _json(proc: subprocess.Popen, what: str) -> Any:
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise ControlError(f"`workbench {what}` exited {proc.returncode}: {err.strip()[-300:]}; "
                           f"run it by hand to see why")
    return json.loads(out)


def engine_kv(arm: Arm, spec, dev: Device, name: str, env: simpy.Environment) -> InstanceKV:
    """What the engine's KV becomes in this arm: the switch and the patch decide, as at start."""
    from workbench.adapters.boot import enabled

    if enabled(arm.env) and arm.patch_takes:
        return elastic_pool(spec, dev, name=name, config=PoolConfig.from_env(arm.env))
    split = int(SPLIT_GIB * GiB)  # the native engine allocates its whole split at start
    dev.occupy("native-kv", split)
    return static_pool(spec, split, name=name, env=env)


def run_arm(arm: Arm, p: NoFakeEnableParams, seed: int) -> dict[str, Any]:
    """One arm's traffic; the device's KV bytes sampled every 0.1 s; ``kvctl list`` mid-burst."""
    env = simpy.Environment()
    spec = get_model(MODEL)
    dev = make_device("sim", preset="h200", env=env, capacity=int(DEVICE_GIB * GiB),
                      name=f"nfe-{arm.name}")
    dev.occupy("weights", spec.weight_bytes)
    ikv = engine_kv(arm, spec, dev, f"nfe-{arm.name}", env)
    n = 24 if p.quick else 64
    reqs = poisson(p.rate, n, prompt_len=p.prompt_len, output_len=p.output_len, seed=seed,
                   start=IDLE_S)
    eng = VLLMLikeEngine(env, arm.name, ikv, StepTimeModel.preset(spec, "h200"),
                         options=VLLMOptions(max_num_seqs=64))
    samples: list[tuple[float, int, int]] = []  # (t, device KV bytes, running requests)

    def kv_bytes() -> int:
        info = dev.mem_info()
        return info.total - info.free - dev.occupied["weights"]

    def sample():
        while True:
            samples.append((env.now, kv_bytes(), len(eng.scheduler.running)))
            yield env.timeout(0.1)

    env.process(sample())
    eng.submit(reqs)
    try:
        mid = IDLE_S + n / p.rate / 2
        env.run(until=mid)  # the burst is running: ask the control plane from outside
        seg = _json(_workbench(["kvctl", "list", "--json"], arm), "kvctl list --json")
        at_mid = {"t": env.now, "pool_mapped": ikv.kv.mapped_bytes,
                  "pool_used_blocks": ikv.kv.used_blocks}
        eng.advance()
        env.run(until=env.now + IDLE_S)
    finally:
        ikv.kv.close()
    return {"arm": arm.name, "seed": seed, "mode": ikv.mode, "page_id_bytes":
            ikv.kv.geometry.page_id_bytes, "samples": samples, "segments": seg, "mid": at_mid,
            "summary": summarize(reqs).as_dict(), "requests": n,
            "ipc_name": arm.env.get(IPC), "pid": os.getpid()}


def judge(run: dict[str, Any], doctor: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each check's verdict and the evidence it read."""
    before = [kv for t, kv, _ in run["samples"] if t < IDLE_S]
    busy = [kv for _, kv, running in run["samples"] if running]
    idle0, peak = max(before), max(busy, default=0)
    page = run["page_id_bytes"]
    cfg = doctor["config"]
    mine = [s for s in run["segments"] if s["owner_pid"] == run["pid"]
            and (run["ipc_name"] is None or s["name"] == run["ipc_name"])]
    seg = mine[0] if mine else None
    s = run["summary"]
    return {
        "served": {"ok": s["finished"] == run["requests"],
                   "evidence": f"{s['finished']}/{run['requests']} requests finished"},
        "autopatch switch": {"ok": bool(cfg["autopatch_enabled"]) and not cfg["config_error"],
                             "evidence": f"doctor: autopatch_enabled={cfg['autopatch_enabled']}, "
                                         f".pth installed={cfg['pth_installed']}"},
        "elastic pool": {"ok": run["mode"] == "elastic",
                         "evidence": f"the engine's KV pool is {run['mode']}"},
        "mapped grows with load": {
            "ok": peak - idle0 >= page,
            "evidence": f"device KV bytes idle {idle0 / GiB:.2f} GiB, under load peak "
                        f"{peak / GiB:.2f} GiB (one page id = {page / GiB:.3f} GiB)"},
        "control segment": {
            "ok": seg is not None and seg["alive"] and seg["mapped"] == run["mid"]["pool_mapped"]
            and seg["used_blocks"] == run["mid"]["pool_used_blocks"] > 0,
            "evidence": (f"kvctl list: {seg['name']!r} pid {seg['owner_pid']}, mapped "
                         f"{seg['mapped'] / GiB:.2f} GiB = the pool's, {seg['used_blocks']} "
                         f"blocks in use" if seg else
                         f"kvctl list: no segment of pid {run['pid']}"
                         + (f" named {run['ipc_name']!r}" if run["ipc_name"] else ""))}}


def run_all(p: NoFakeEnableParams, progress: Progress | None = None) -> dict[str, Any]:
    """Every arm over the seeds, the arm order reversed on odd seeds; doctor once per arm."""
    table = arms(f"wblab-nfe-{os.getpid()}-{secrets.token_hex(3)}")
    by_env: dict[tuple, subprocess.Popen] = {}  # one doctor per distinct environment
    for arm in table.values():
        key = tuple(sorted(arm.env.items()))
        by_env.setdefault(key, _workbench(["doctor", "--json"], arm))
    doctors = {a: by_env[tuple(sorted(arm.env.items()))] for a, arm in table.items()}
    seeds = [p.seed] if p.quick else [p.seed, p.seed + 1, p.seed + 2]
    runs, total = [], len(seeds) * len(ARMS)
    try:
        for i, seed in enumerate(seeds):
            for a in (ARMS if i % 2 == 0 else ARMS[::-1]):
                runs.append(run_arm(table[a], p, seed))
                if progress:
                    progress(len(runs), total, f"{a} seed {seed}")
    finally:
        answers = {id(proc): _json(proc, "doctor --json") for proc in by_env.values()}
        docs = {a: answers[id(proc)] for a, proc in doctors.items()}
    for r in runs:
        r["checks"] = judge(r, docs[r["arm"]])
    return {"runs": runs, "seeds": seeds, "arms": {a: t.env for a, t in table.items()},
            "doctor": {a: d["config"] for a, d in docs.items()}}


