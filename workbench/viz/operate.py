"""Chapter 07's operating tools: drive the ``workbench`` CLI against a pool this process owns,
lay a patch plan's variants out per engine version, a stand-in engine to upgrade, and the failure
decision tree of seed 000 §16 as a figure.

A pool applies a ``kvctl limit`` on its owner's next alloc or free (the control segment is
polled there), so a notebook that owns the pool must keep polling while the CLI waits for its
answer: :func:`cli_while_owning` does what an engine's step loop would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from types import ModuleType

import plotly.graph_objects as go

from workbench.adapters.patching import need_params, replace_class
from workbench.adapters.registry import EnginePlan, Patch
from workbench.viz.style import FONT, MUTED, VARIANT_COLORS, WHITE

CLI_ENV = {"COLUMNS": "100", "NO_COLOR": "1"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # bold/dim survive NO_COLOR under a notebook's TERM


def _plain(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(r.args, r.returncode, _ANSI.sub("", r.stdout or ""),
                                       _ANSI.sub("", r.stderr or ""))


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m workbench ARGS`` in a child process (this interpreter), 100 columns wide."""
    return _plain(subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True,
                                 text=True, timeout=timeout,
                                 env={**os.environ, **CLI_ENV, **(env or {})}))


def cli_while_owning(kv, *args: str, poll_s: float = 0.02,
                     timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a CLI command that waits for ``kv``'s answer, polling ``kv``'s control segment until
    the command exits (the owner's alloc/free would poll it in an engine)."""
    cmd = [sys.executable, "-m", "workbench", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **CLI_ENV})
    end = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < end:
        kv.poll_control()
        time.sleep(poll_s)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    return _plain(subprocess.CompletedProcess(cmd, proc.returncode, out, err))


def pool_panel(frame: str, name: str) -> str:
    """The lines of ``kvtop --once`` output that draw pool ``name`` (its legend lines first); an
    empty string when the frame has no such pool."""
    lines = frame.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"╭─ {name} ")), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("╰")), start)
    legend = ([ln for ln in lines[:start] if ln.startswith("pages:")][:1]
              + [ln for ln in lines[:start] if ln.startswith("bar:")][:1])
    return "\n".join(legend + lines[start:end + 1])


# -- a plan's variants per version ----------------------------------------------------------
def variant_matrix(plan: EnginePlan, versions: list[str]) -> list[dict[str, str]]:
    """One row per patch name: for each version, the range of the variant it gets, ``refused``
    (a required patch with no variant for it) or ``none`` (an optional one: the engine runs
    without it)."""
    rows = {name: {"patch": name} for name in dict.fromkeys(p.name for p in plan.patches)}
    for v in versions:
        chosen, problems, records = plan.select(v)
        for p in chosen:
            rows[p.name][v] = p.versions
        for name, _why, _fix in problems:
            rows[name][v] = "refused"
        for r in records:
            rows[r.patch][v] = "none"
    return list(rows.values())


def variant_figure(rows: list[dict[str, str]], versions: list[str],
                   title: str = "Which variant each patch gets") -> go.Figure:
    """A grid: patches down, versions across; a colour per distinct variant range, red for
    refused, grey for an optional patch the version goes without."""
    ranges = sorted({r[v] for r in rows for v in versions} - {"refused", "none"})
    code = {rng: i + 1 for i, rng in enumerate(ranges)} | {"refused": 0, "none": len(ranges) + 1}
    palette = VARIANT_COLORS[:len(ranges) + 1] + [MUTED]
    n = len(ranges) + 2
    scale = [[k / n, palette[k % len(palette)]] for k in range(n)]
    scale = [pt for k, (_, c) in enumerate(scale) for pt in ([k / n, c], [(k + 1) / n, c])]
    z = [[code[r[v]] for v in versions] for r in rows]
    text = [[r[v] for v in versions] for r in rows]
    fig = go.Figure(go.Heatmap(z=z, x=versions, y=[r["patch"] for r in rows], text=text,
                               texttemplate="%{text}", zmin=-0.5, zmax=n - 0.5,
                               colorscale=scale, showscale=False, xgap=3, ygap=3,
                               hovertemplate="%{y} on %{x}: %{text}<extra></extra>"))
    fig.update_layout(title=title, font=FONT, height=120 + 50 * len(rows),
                      xaxis=dict(title="installed engine version", type="category"),
                      yaxis=dict(autorange="reversed"), margin=dict(l=150, r=10, t=50, b=50))
    return fig


# -- a stand-in engine to upgrade ------------------------------------------------------------
TOY = "toyserve"


def toy_engine(version: str, *, lookahead: bool) -> ModuleType:
    """Install a two-module engine ``toyserve`` (``toyserve.block_pool.BlockPool``) in
    ``sys.modules``; ``lookahead`` adds the constructor parameter its 0.2 release gained, the
    way vLLM 0.33's ``BlockPool`` gained ``num_hash_lookahead_tokens``."""
    remove_toy_engine()
    pkg, mod = ModuleType(TOY), ModuleType(f"{TOY}.block_pool")
    pkg.__version__, pkg.__path__ = version, []

    if lookahead:
        class BlockPool:
            def __init__(self, num_blocks: int, enable_caching: bool, lookahead_tokens: int = 0):
                self.num_blocks, self.lookahead = num_blocks, lookahead_tokens
    else:
        class BlockPool:  # type: ignore[no-redef]
            def __init__(self, num_blocks: int, enable_caching: bool):
                self.num_blocks, self.lookahead = num_blocks, 0

    BlockPool.__module__, BlockPool.__qualname__ = mod.__name__, "BlockPool"
    mod.BlockPool, pkg.block_pool = BlockPool, mod
    sys.modules[TOY], sys.modules[mod.__name__] = pkg, mod
    return pkg


def remove_toy_engine() -> None:
    for name in [n for n in sys.modules if n == TOY or n.startswith(TOY + ".")]:
        del sys.modules[name]


def toy_plan() -> EnginePlan:
    """``toyserve``'s plan: one patch with a variant per release, each check pinning its seam."""
    def elastic(base: type) -> type:
        return type("ElasticBlockPool", (base,), {"elastic": True})

    def apply(m: ModuleType):
        return replace_class(m, "BlockPool", elastic(m.BlockPool), TOY)

    def check(*params: str):
        return lambda m: need_params(m.BlockPool.__init__, "num_blocks", "enable_caching",
                                     *params)

    fix = "install toyserve 0.1.x or 0.2.x (the releases this plan was written for)"
    mod = f"{TOY}.block_pool"
    return EnginePlan("toyserve", TOY, (TOY,), [
        Patch("elastic-block-pool", mod, ">=0.1,<0.2", apply, check(), fix=fix),
        Patch("elastic-block-pool", mod, ">=0.2,<0.3", apply, check("lookahead_tokens"),
              fix=fix),
    ])


# -- seed 000 §16: the failure decision tree -------------------------------------------------
# (symptom, parent, how to see it with the workbench)
FAILURE_TREE: list[tuple[str, str, str]] = [
    ("start-up fails", "", ""),
    ("no patch log", "start-up fails", "doctor: autopatch on/off, .pth installed/missing"),
    (".pth missing or not run", "no patch log", "python -m workbench.adapters.pth status"),
    ("switch unset", "no patch log", "doctor prints autopatch=off (WORKBENCH_KV_AUTOPATCH)"),
    ("patch target missing", "start-up fails", "AutopatchError: which patch, why, the fix"),
    ("engine outside the plan's ranges", "patch target missing", "doctor lists it as refused"),
    ("upstream module moved", "patch target missing", "doctor --check: cannot import target"),
    ("geometry / layout error", "start-up fails", "a ConfigError when the pool is built"),
    ("block bigger than a VMM page", "geometry / layout error", "KVGeometry names the fix"),
    ("layers/buffers differ from the tensors", "geometry / layout error",
     "KVGeometry.check_tensors"),
    ("layout not supported (packed, inline scale)", "geometry / layout error",
     "the adapter refuses it with a message"),
    ("worker socket error", "start-up fails", "chapter 06: the TP/PP workers"),
    ("IPC names differ", "worker socket error", "kvctl list: which names exist"),
    ("wrong rank or device", "worker socket error", "each worker's rank and device"),
    ("PP namespace or listener not ready", "worker socket error",
     "one socket namespace per stage (pp<k>/w<rank>.sock)"),
    ("runtime fault", "", ""),
    ("allocation miss", "runtime fault", "alloc() returns None; the scheduler retries"),
    ("physical contention (normal)", "allocation miss", "the scheduler waits or preempts"),
    ("prefix cache or reserve too large", "allocation miss", "kvtop: reserved pages, cached"),
    ("memory not returned", "runtime fault", "kvtop page map"),
    ("live or cached blocks", "memory not returned", "pages in_use"),
    ("partly occupied pages", "memory not returned", "the idle-footprint lab"),
    ("reserve pages", "memory not returned", "pages reserved"),
    ("async retired pages", "memory not returned", "pages retired"),
    ("illegal memory access", "runtime fault", "a GPU fault, not a Python error"),
    ("stride or layout wrong", "illegal memory access", "single-GPU layout tests"),
    ("unmap too early", "illegal memory access", "release barrier, RETIRED state"),
    ("wrong output", "runtime fault", "fixed-output comparison"),
    ("K/V offset or kernel-block geometry", "wrong output", "per-layer view offsets"),
    ("hybrid group / shared layer binding", "wrong output", "chapter 09: KV groups"),
    ("Mamba state / partial tail", "wrong output", "chapter 09: state cells"),
]


def tree_figure(title: str = "Failure decision tree (seed 000 §16)") -> go.Figure:
    """The tree as an icicle chart: click a branch to open it; hover shows what to run."""
    fig = go.Figure(go.Icicle(labels=[n for n, _, _ in FAILURE_TREE],
                              parents=[p for _, p, _ in FAILURE_TREE],
                              customdata=[h or "open a branch" for _, _, h in FAILURE_TREE],
                              hovertemplate="%{label}<br>%{customdata}<extra></extra>",
                              tiling=dict(orientation="h"), maxdepth=3, root_color=WHITE))
    fig.update_layout(title=title, font=FONT, height=480, margin=dict(l=10, r=10, t=50, b=10))
    return fig
