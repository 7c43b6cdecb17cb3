"""First-use costs of the mini engine: a warm-up that runs every kind of step a serving run meets,
and the instruments that show what a cold step paid for.

A process pays once for each new *kind* of step: a Triton specialization compiled on its first
launch, a library kernel loaded or an algorithm chosen on its first use, the caching allocator
growing. One 256-token prompt (the old warm-up) runs a pure prefill and graphed decodes only, so
a serving run's first mixed step (decodes beside a prefill), first recompute-length prefill (a
preempted request: prompt plus its generated tokens, any length) or first prefill chunk over
earlier context paid that cost on the request path. :func:`warm_up` runs each of those kinds
before any request is timed; :class:`CompileLog` records every Triton compile with its time, and
:func:`step_shape` names a step's kind, so a slow step in a run says what it was.

``python -m workbench.mini.warmup`` (CUDA) builds a few layers of the Llama-8B shape, runs the old
warm-up, then the new one twice and fresh shapes after it, each step timed (and profiled when
slow): where the first-use time goes, and whether anything new is still slow after the warm-up.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.mini.engine import Engine, StepStats

SLOW_STEP_S = 0.3  # a step this slow on an H200 is a one-off cost, not the model's step time


@dataclass(slots=True)
class CompileLog:
    """Triton compiles (cache misses of a ``@triton.jit`` kernel) with their wall time:
    ``[start, end or None, what]`` on the ``perf_counter`` clock. :meth:`install` hooks the
    installed Triton's compile hooks (``triton.knobs.runtime`` or, older, ``JITFunction``)."""

    events: list[list] = field(default_factory=list)
    installed: str = ""  # which hook API took it ("" where Triton is absent)
    _undo: list[Callable[[], None]] = field(default_factory=list)

    def install(self) -> bool:
        try:
            import triton
            from triton.runtime.jit import JITFunction
        except ImportError:
            return False
        rt = getattr(getattr(triton, "knobs", None), "runtime", None)
        owner = rt if rt is not None and hasattr(rt, "jit_cache_hook") else JITFunction
        names = (("jit_cache_hook", "jit_post_compile_hook") if owner is rt
                 else ("cache_hook", "compiled_hook"))
        for name, fn in zip(names, (self._start, self._end), strict=True):
            if not hasattr(owner, name):
                continue
            prev = getattr(owner, name)
            setattr(owner, name, fn)
            self._undo.append(lambda o=owner, n=name, p=prev: setattr(o, n, p))
        self.installed = f"{'triton.knobs.runtime' if owner is rt else 'JITFunction'}." \
                         f"{names[0]}" if self._undo else ""
        return bool(self._undo)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _start(self, *args, **kw) -> None:  # None: go on and compile
        what = str(kw.get("repr", "") or kw.get("key", ""))
        self.events.append([time.perf_counter(), None, what[:240]])

    def _end(self, *args, **kw) -> None:
        for ev in reversed(self.events):
            if ev[1] is None:
                ev[1] = time.perf_counter()
                break

    def take(self, t0: float) -> list[list]:
        """Events since ``t0`` as ``[start - t0, seconds or None, what]``, then forgotten."""
        out = [[round(e[0] - t0, 4), None if e[1] is None else round(e[1] - e[0], 4), e[2]]
               for e in self.events]
        self.events.clear()
        return out


def step_shape(st: StepStats) -> str:
    """A step's kind in words: ``16 dec + pre 258/258 + pre 262/262 (graphed)``; a prefill is
    ``q_len/ctx_len`` (ctx_len > q_len: a chunk over earlier context)."""
    parts = [f"{st.num_decode} dec"] if st.num_decode else []
    parts += [f"pre {q}/{c}" for q, c in st.prefills]
    return " + ".join(parts) + (" (graphed)" if st.graphed else "")


def warm_up(engine: Engine, prompt_len: int = 256, decodes: int = 8,
            on_step: Callable[[StepStats], None] | None = None) -> list[StepStats]:
    """Run each kind of step a serving run meets, then leave the engine idle and its stats empty.

    Kinds: a pure prefill; graphed decodes; decodes beside one prefill and beside two of
    lengths that are not multiples of 16 (recompute-like: prompt + a few generated tokens); a
    prefill longer than the token budget, so its second chunk attends over earlier context.
    Lengths shrink to fit a small pool (tests). Returns the steps it ran."""
    g = engine.kv.geometry
    cap = (g.num_blocks - 1) * g.block_size
    budget = engine.cfg.max_batched_tokens
    room = max(cap * 3 // 4, 8)  # what one phase may hold at once
    p = max(2, min(prompt_len, room // (decodes + 5)))
    odd = (p + 3, p + 5, 2 * p + 7)
    long = min(budget + 64, room - 8)
    steps: list[StepStats] = []

    def run(until: Callable[[], bool]) -> None:
        while engine.has_work() and not until():
            n = len(engine.stats.steps)
            engine.step()
            if len(engine.stats.steps) > n:
                st = engine.stats.steps[-1]
                steps.append(st)
                if on_step is not None:
                    on_step(st)

    base = [engine.add_request([1] * p, 8) for _ in range(decodes)]
    run(lambda: all(s.num_computed >= s.prompt_len for s in base))  # prefill, chunked if big
    for n in (odd[:1], odd[1:]):  # decodes + one prefill, decodes + two
        for length in n:
            engine.add_request([1] * min(length, room // 4), 4)
        run(lambda: not engine.scheduler.waiting)
    run(lambda: False)
    if long > budget:  # a prefill in two chunks beside decodes
        base = [engine.add_request([1] * p, 4) for _ in range(2)]
        run(lambda: all(s.num_computed >= s.prompt_len for s in base))
        engine.add_request([1] * long, 2)
    run(lambda: False)
    engine.stats.steps.clear()
    return steps


def _show(st: StepStats) -> None:
    print(f"  {st.seconds * 1e3:8.1f} ms  {step_shape(st)}")


def _phase(name: str, fn: Callable[[], object], log: CompileLog, sync: Callable[[], None],
           profile: bool) -> None:
    """Run ``fn``, print its compiles and time, and (``profile``, slow) the ops that took it."""
    import torch

    t0 = time.perf_counter()
    print(f"{name}:")
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as pr:
            fn()
    else:
        fn()
    sync()
    for ev in log.take(t0):
        print(f"  compile at +{ev[0]:.3f} s, {ev[1]} s: {ev[2]}")
    print(f"  phase {time.perf_counter() - t0:.2f} s")
    if profile and time.perf_counter() - t0 > SLOW_STEP_S:
        print(pr.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def _old_warm_up(eng: Engine) -> None:
    """The clusters' warm-up before this module: one 256-token prompt, 4 tokens."""
    eng.generate([[1] * 256], 4)
    for st in eng.stats.steps:
        _show(st)
    eng.stats.steps.clear()


def _fresh_shapes(eng: Engine) -> None:
    """Lengths the warm-up did not run: 16 decodes beside prefills of 258 ... 517 tokens."""
    seqs = [eng.add_request([2] * 256, 8) for _ in range(16)]
    while not all(s.num_computed >= s.prompt_len for s in seqs):
        eng.step()
    for n in (258, 262, 301, 333, 517):
        eng.add_request([3] * n, 2)
    while eng.has_work():
        eng.step()
    for st in eng.stats.steps:
        _show(st)
    eng.stats.steps.clear()


def _probe(layers: int, profile: bool, device: str = "cuda", model: str = "llama-3.1-8b"
           ) -> None:
    """The first-use report (see the module docstring)."""
    import torch

    from workbench.mini.engine import EngineConfig
    from workbench.mini.kv import KVSpec
    from workbench.mini.model import get_config

    log = CompileLog()
    print(f"triton compile hook: {log.installed or 'none'}" if log.install() else
          "triton compile hook: not available")
    mcfg = get_config(model, num_layers=layers)
    kv_bytes = int(5440 * mcfg.kv_bytes_per_token)  # the colocation lab's static split, per engine
    t = time.perf_counter()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    eng = Engine(mcfg, KVSpec("block", "static", kv_bytes), device,
                 EngineConfig(max_num_seqs=256, max_batched_tokens=2048))
    sync()
    print(f"built + graphs captured: {time.perf_counter() - t:.1f} s; "
          f"compiles {len(log.take(t))}")
    if profile:  # the profiler's own first start, outside any phase
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            pass
    for name, fn in (("old warm-up (one 256-token prompt)", lambda: _old_warm_up(eng)),
                     ("warm-up, first pass", lambda: warm_up(eng, 256, on_step=_show)),
                     ("warm-up, second pass", lambda: warm_up(eng, 256, on_step=_show)),
                     ("fresh shapes after the warm-up", lambda: _fresh_shapes(eng))):
        _phase(name, fn, log, sync, profile)
    eng.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="first-use step costs of the mini engine (CUDA)")
    ap.add_argument("--layers", type=int, default=2, help="layers of the Llama-8B shape")
    ap.add_argument("--profile", action="store_true", help="op table of each slow phase")
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a smoke run)")
    ap.add_argument("--model", default="llama-3.1-8b", help="registry model (shape)")
    args = ap.parse_args(argv)
    _probe(args.layers, args.profile, args.device, args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
