"""``workbench doctor``: the version manifest of seed 000 §2 and each engine's patch status.

What it prints is what a run needs to be reproduced: hardware, Python, torch and CUDA, engine
versions (and commits when the install records one), the workbench's own version and commit, the
``WORKBENCH_KV_*`` configuration, whether the autopatch ``.pth`` is installed, and per engine
which patches its installed version gets. ``--check`` also imports each engine's patch targets
here and applies the plan, so a version the patches cannot handle fails now, not at serve time,
and exits non-zero on a bad configuration.

Per backend (``sim``, ``host``, ``gpu`` and every further ``cuda:N``) it says whether it can run
here and why not (:func:`workbench.backends.probe`), and for CUDA the driver version, the
cuda-python version, the VMM granularity and the device seen; per engine, what the adapters
accept (executors, tensor-parallel sizes), from the plan module's ``ACCEPTS``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import typer

from workbench.cli.common import cli_syntax, out_option, write_json
from workbench.cli.root import app
from workbench.manifest import host_hardware, torch_info, workbench_info
from workbench.terminal import plain


def _dist_commit(dist: str) -> str | None:
    """The VCS commit pip recorded for a source install (direct_url.json), if any."""
    try:
        raw = metadata.distribution(dist).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not raw:
        return None
    info = json.loads(raw)
    return (info.get("vcs_info") or {}).get("commit_id")


def _config() -> dict:
    from workbench.adapters import boot, pth
    from workbench.config import PoolConfig
    from workbench.settings import ENV_PREFIX, unknown_names

    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIX)}
    unknown = unknown_names()  # listed below, so the pool config is read without them
    try:
        known = {k: v for k, v in env.items() if k not in unknown}
        cfg, enabled = asdict(PoolConfig.from_env(known)), boot.enabled()
        err = None
    except Exception as e:  # noqa: BLE001 - shown, not raised: doctor reports bad config
        cfg, err, enabled = None, str(e), False
    return {"env": env, "pool_config": cfg, "config_error": err, "unknown_env": unknown,
            "autopatch_enabled": enabled, "pth": str(pth.path()),
            "pth_installed": pth.installed()}


def _engines(check: bool) -> dict:
    from workbench.adapters import boot
    from workbench.adapters.registry import AutopatchError
    from workbench.adapters.versions import dist_version

    out: dict[str, dict] = {}
    for engine, (_, dists) in boot.ENGINES.items():
        found = dist_version(*dists)
        if found is None:
            out[engine] = {"installed": False}
            continue
        dist, version = found
        plan = boot.load_plan(engine)
        chosen, problems, skipped = plan.select(version)
        patches = [{"patch": p.name, "module": p.module, "versions": p.versions,
                    "status": "would apply", "doc": p.doc} for p in chosen]
        patches += [{"patch": n, "module": "", "versions": "", "status": "refused",
                     "doc": f"{why}. Fix: {fix}"} for n, why, fix in problems]
        patches += [r.as_dict() for r in skipped]
        entry = {"installed": True, "distribution": dist, "version": version,
                 "commit": _dist_commit(dist), "patches": patches}
        if check:
            live = boot.plans().get(engine) or plan
            try:
                if live.state == "idle":
                    live.apply_all()
                entry["check"] = {"state": live.state,
                                  "records": [r.as_dict() for r in live.records]}
            except AutopatchError as err:
                entry["check"] = {"state": "failed", "error": str(err)}
        out[engine] = entry
    return out


def _cuda_driver_version() -> str | None:
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if cu.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def _gpu_facts(name: str, usable: bool) -> dict:
    from workbench.backends import make_device
    from workbench.errors import WorkbenchError
    from workbench.manifest import dist_version

    facts = {"driver": _cuda_driver_version(),
             "cuda_python": dist_version("cuda-python") or dist_version("cuda-bindings")}
    if usable:  # open it: VMM support and granularity are only known from the device
        try:
            dev = make_device(name)
        except WorkbenchError as err:
            return {**facts, "usable": False, "why": str(err)}
        facts.update(device=dev.name, granularity=dev.granularity,
                     memory=dev.mem_info().total)
        dev.close()
    return facts


def _backends() -> list[dict]:
    from workbench import backends

    extra = [f"cuda:{i}" for i in range(1, backends.cuda_device_count())]
    rows = []
    for name in (*backends.BACKENDS, *extra):
        ok, why = backends.probe(name)
        row = {"backend": name, "usable": ok, "why": why}
        if backends.capabilities(name).cuda:
            row.update(_gpu_facts(name, ok))
        rows.append(row)
    return rows


# What the adapters accept when a plan module declares no ACCEPTS of its own.
_ACCEPTS_DEFAULT = {"vllm": {"executors": ["uni"], "tensor_parallel": "1",
                             "note": "engine core and model runner in one process "
                                     "(VLLM_ENABLE_V1_MULTIPROCESSING=0)"}}


def _accepts() -> dict:
    import importlib

    from workbench.adapters import boot

    out = {}
    for engine, (target, _) in boot.ENGINES.items():
        module = importlib.import_module(target.split(":")[0])  # workbench code only
        out[engine] = getattr(module, "ACCEPTS", None) or _ACCEPTS_DEFAULT.get(engine, {})
    return out


def manifest(check: bool = False) -> dict:
    return {
        "hardware": host_hardware(),
        "os": platform.platform(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "torch": torch_info(),
        "workbench": workbench_info(),
        "config": _config(),
        "backends": _backends(),
        "accepts": _accepts(),
        "engines": _engines(check),
    }


def _print(m: dict) -> None:
    from workbench.units import format_size

    hw, t = m["hardware"], m["torch"]

    def echo(text: str) -> None:  # values from the environment, shown inert line by line
        typer.echo("\n".join(plain(line) for line in text.split("\n")))

    echo(f"hardware   {hw['cpu']} x{hw['cores']} ({hw['machine']}), "
         f"{format_size(hw['memory']) if hw['memory'] else '?'} RAM")
    echo(f"os         {m['os']}")
    echo(f"python     {m['python']['version']} ({m['python']['executable']})")
    if t["installed"]:
        gpus = ", ".join(g["name"] for g in t["gpus"]) or "no GPU visible"
        echo(f"torch      {t['version']} cuda={t['cuda']} hip={t['hip']}: {gpus}")
    else:
        echo("torch      not installed")
    wb = m["workbench"]
    echo(f"workbench  {wb['version']} commit={wb['commit'] or '?'}")
    c = m["config"]
    echo(f"config     autopatch={'on' if c['autopatch_enabled'] else 'off'} "
         f".pth={'installed' if c['pth_installed'] else 'missing'} ({c['pth']})")
    if c["autopatch_enabled"] and not c["pth_installed"]:
        echo("           WARNING: autopatch is on but the .pth is missing here: engines started "
             "by this interpreter run UNPATCHED (python -m workbench.adapters.pth install)")
    if c["config_error"]:
        echo(f"           BAD CONFIG: {c['config_error']}")
    else:
        echo("           " + " ".join(f"{k}={v}" for k, v in c["pool_config"].items()))
    for k, v in c["env"].items():
        echo(f"           {k}={v}")
    for k in c["unknown_env"]:
        echo(f"           UNKNOWN SETTING: {k} is not a workbench setting (a typo?)")
    for b in m["backends"]:
        if b["usable"]:
            extra = (f" driver {b['driver']} cuda-python {b['cuda_python']} {b['device']} "
                     f"granularity {format_size(b['granularity'])}" if "device" in b else "")
            echo(f"backend    {b['backend']:<8} usable{extra}")
        else:
            echo(f"backend    {b['backend']:<8} NOT usable: {cli_syntax(b['why'])}")
    for engine, acc in m["accepts"].items():
        if acc:
            echo(f"accepts    {engine:<8} executors={','.join(acc['executors'])} "
                 f"tp={acc['tensor_parallel']}" + (f" ({acc['note']})" if acc.get("note") else ""))
    for engine, e in m["engines"].items():
        if not e["installed"]:
            echo(f"{engine:<10} not installed")
            continue
        echo(f"{engine:<10} {e['distribution']} {e['version']} commit={e['commit'] or '?'}")
        for p in e["patches"]:
            echo(f"           {p['status']:<14} {p['patch']:<26} {p['versions']:<20} {p['doc']}")
        if "check" in e:
            chk = e["check"]
            echo(f"           check: {chk['state']}" + (f"\n{chk['error']}" if "error" in chk
                                                          else ""))


@app.command(short_help="Version manifest and each engine's patch status.")
def doctor(as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
           out: Path | None = out_option("Write the manifest as JSON to this file."),
           check: bool = typer.Option(False, "--check",
                                      help="Import each engine's patch targets and apply the "
                                           "plan here (slow: imports the engines).")) -> None:
    """Version manifest (hardware, Python, torch/CUDA, engines, config) and patch status."""
    m = manifest(check=check)
    write_json(m, out)
    if as_json:
        typer.echo(json.dumps(m, indent=2, default=str))
    else:
        _print(m)
        if check and not any(e["installed"] for e in m["engines"].values()):
            typer.echo("check      no engine is installed here: nothing to import or patch "
                       "(the engines' environments: docs/adapters.md)")
    failed = any(e.get("check", {}).get("state") == "failed" for e in m["engines"].values())
    # --check refuses what a plain run only reports: a bad or an unknown WORKBENCH_KV_* name
    failed = failed or (check and bool(m["config"]["config_error"] or m["config"]["unknown_env"]))
    raise typer.Exit(1 if failed else 0)
